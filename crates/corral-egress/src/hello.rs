//! The first bytes of a tunnel (untrusted): they must be a TLS ClientHello, whose server name
//! (SNI) the proxy compares with the name the tunnel was allowed for. Parsed by rustls's
//! [`Acceptor`], which reassembles a ClientHello split across records; nothing is answered
//! from here: the bytes are forwarded as they came once the name is checked.

use rustls::server::Acceptor;

/// The most bytes buffered for a ClientHello: two full TLS records.
pub const MAX_HELLO: usize = 2 * (16 * 1024 + 5);

/// What the first bytes of a tunnel turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A complete ClientHello with this server name (none: it sent no SNI, or an address).
    ServerName(Option<String>),
    /// Not a TLS handshake (another protocol, or a malformed ClientHello).
    NotTls(String),
    /// Longer than [`MAX_HELLO`] without being complete.
    TooLarge,
}

/// Reads a ClientHello as its bytes arrive.
#[derive(Default)]
pub struct HelloReader {
    acceptor: Acceptor,
    /// Everything pushed so far, forwarded once the name is checked.
    pub bytes: Vec<u8>,
}

impl HelloReader {
    /// Adds `chunk`; `None` while more bytes are needed.
    pub fn push(&mut self, chunk: &[u8]) -> Option<Hello> {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.first().is_some_and(|&b| b != 0x16) {
            return Some(Hello::NotTls(
                "it does not start with a TLS handshake record".into(),
            ));
        }
        if self.bytes.len() > MAX_HELLO {
            return Some(Hello::TooLarge);
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            match self.acceptor.read_tls(&mut rest) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return Some(Hello::NotTls(e.to_string())),
            }
        }
        match self.acceptor.accept() {
            Ok(None) => None,
            Ok(Some(accepted)) => Some(Hello::ServerName(
                accepted.client_hello().server_name().map(str::to_string),
            )),
            Err((e, _alert)) => Some(Hello::NotTls(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A ClientHello as OpenSSL 3 sends it for `https://example.org/`, with SNI `example.org`.
    pub(crate) fn client_hello(name: &str) -> Vec<u8> {
        // Extensions: server_name, supported_versions (TLS 1.3), supported_groups (x25519),
        // signature_algorithms (ed25519), key_share (x25519, 32 zero bytes).
        let mut ext = Vec::new();
        let sni_name = name.as_bytes();
        let mut sni = vec![0u8];
        sni.extend_from_slice(&(sni_name.len() as u16).to_be_bytes());
        sni.extend_from_slice(sni_name);
        let mut sni_list = (sni.len() as u16).to_be_bytes().to_vec();
        sni_list.extend_from_slice(&sni);
        if !name.is_empty() {
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&(sni_list.len() as u16).to_be_bytes());
            ext.extend_from_slice(&sni_list);
        }
        ext.extend_from_slice(&[0, 0x2b, 0, 3, 2, 3, 4]);
        ext.extend_from_slice(&[0, 0x0a, 0, 4, 0, 2, 0, 0x1d]);
        ext.extend_from_slice(&[0, 0x0d, 0, 4, 0, 2, 8, 7]);
        ext.extend_from_slice(&[0, 0x33, 0, 38, 0, 36, 0, 0x1d, 0, 32]);
        ext.extend_from_slice(&[0u8; 32]);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]); // random
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut record = vec![0x16, 3, 1];
        record.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        record.extend_from_slice(&hs);
        record
    }

    fn read_all(bytes: &[u8], chunk: usize) -> Option<Hello> {
        let mut r = HelloReader::default();
        for piece in bytes.chunks(chunk.max(1)) {
            if let Some(h) = r.push(piece) {
                return Some(h);
            }
        }
        None
    }

    #[test]
    fn the_server_name_is_read_however_the_bytes_arrive() {
        let hello = client_hello("example.org");
        for chunk in [1, 2, 5, 100, hello.len()] {
            assert_eq!(
                read_all(&hello, chunk),
                Some(Hello::ServerName(Some("example.org".into()))),
                "{chunk}"
            );
        }
        assert_eq!(
            read_all(&client_hello(""), 7),
            Some(Hello::ServerName(None))
        );
        assert_eq!(read_all(&hello[..hello.len() - 1], 9), None);
    }

    #[test]
    fn other_protocols_are_not_tls() {
        for other in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"SSH-2.0-OpenSSH_9.2\r\n",
            b"\x80\x2e\x01",
        ] {
            assert!(
                matches!(read_all(other, 3), Some(Hello::NotTls(_))),
                "{other:?}"
            );
        }
        // A handshake record that holds no ClientHello.
        assert!(matches!(
            read_all(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0], 9),
            Some(Hello::NotTls(_))
        ));
        let mut endless = vec![0x16, 3, 1, 0x40, 0];
        endless.extend(std::iter::repeat_n(0u8, MAX_HELLO));
        assert!(matches!(
            read_all(&endless, 4096),
            Some(Hello::TooLarge | Hello::NotTls(_))
        ));
    }

    proptest! {
        #[test]
        fn any_bytes_end_in_a_verdict_or_wait_within_the_bound(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096),
            chunk in 1usize..512,
        ) {
            let mut r = HelloReader::default();
            for piece in bytes.chunks(chunk) {
                if r.push(piece).is_some() {
                    return Ok(());
                }
            }
            prop_assert!(r.bytes.len() <= MAX_HELLO);
        }

        #[test]
        fn names_survive_any_split(name in "[a-z]{1,20}\\.[a-z]{2,5}", chunk in 1usize..300) {
            prop_assert_eq!(
                read_all(&client_hello(&name), chunk),
                Some(Hello::ServerName(Some(name)))
            );
        }
    }
}
