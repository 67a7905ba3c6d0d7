//! A tenant's narrower range under an operator's bound of everything (issue 31): with
//! `[network] cidrs = ["0.0.0.0/0", "::/0"]`, a tenant that asks for `127.0.0.0/8`, `::1/128`,
//! `169.254.169.254/32` or `10.0.0.0/8` reaches none of their addresses, through the native
//! API (a session, a run, the server's default that the MCP tools get) and the E2B face
//! (`allowOut` under `denyOut: ["0.0.0.0/0"]`): the proxy refuses each with the internal-address
//! denial, and a listener on the host's loopback sees no connection. Only a range the operator
//! names in `[network] cidrs` opts its internal addresses in (docs/network.md).

use std::net::TcpListener;

use super::*;

/// A listener on the host's 127.0.0.1 and [::1], on one ephemeral port, that must see nothing.
struct Loopback {
    v4: TcpListener,
    v6: Option<TcpListener>,
    port: u16,
}

impl Loopback {
    fn new() -> Loopback {
        let v4 = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = v4.local_addr().unwrap().port();
        let v6 = TcpListener::bind(("::1", port)).ok();
        for l in std::iter::once(&v4).chain(&v6) {
            l.set_nonblocking(true).unwrap();
        }
        Loopback { v4, v6, port }
    }

    /// The connections that arrived.
    fn accepted(&self) -> usize {
        thread::sleep(Duration::from_millis(100));
        std::iter::once(&self.v4)
            .chain(&self.v6)
            .map(|l| std::iter::from_fn(|| l.accept().ok()).count())
            .sum()
    }
}

/// The attack that tunnels to 127.0.0.1, [::1], 169.254.169.254 and 10.1.1.1 on `port`.
fn attack(port: u16) -> String {
    format!(
        "import os\nos.environ.update({{'ATTACK': 'internal-ranges', 'PORT': '{port}', \
         'MARK': 'ranges'}})\n{PRELUDE}\n{}",
        include_str!("../attacks/net_egress.py")
    )
}

/// Each tunnel of the attack was refused with the internal-address denial of its kind.
fn refused(o: &Outcome, face: &str, found: &mut Vec<String>) {
    for (what, kind) in [
        ("loopback", "loopback"),
        ("loopback-v6", "loopback"),
        ("metadata", "link-local"),
        ("private", "private"),
    ] {
        let what = format!("connect-{what}");
        let answer = o
            .lines()
            .find_map(|l| l.strip_prefix(&format!("ANSWER {what} ")))
            .unwrap_or_default()
            .to_string();
        let denied = o.has_line(&format!("BLOCKED {what} HTTP403"))
            && answer.contains(&format!("is a {kind} address"));
        if !denied {
            found.push(format!(
                "{face}: {what} was not refused as internal: {answer:?}\n{}",
                o.dump()
            ));
        }
    }
}

#[test]
fn network_egress_a_tenants_range_within_everything_reaches_no_internal_address() {
    let _g = shared();
    let l = Loopback::new();
    let p = l.port;
    let s = Server::start_with(
        1,
        &format!(
            "[network]\ncidrs = [\"0.0.0.0/0\", \"::/0\", \"0.0.0.0/0:{p}\", \"[::/0]:{p}\"]\n\
             default = [\"127.0.0.0/8:{p}\", \"[::1/128]:{p}\", \"169.254.169.254/32:{p}\", \
             \"10.0.0.0/8:{p}\"]\n"
        ),
    );
    let key = s.key("A");
    let cidrs = json!([
        format!("127.0.0.0/8:{p}"),
        format!("[::1/128]:{p}"),
        format!("169.254.169.254/32:{p}"),
        format!("10.0.0.0/8:{p}"),
    ]);
    let code = attack(p);
    let mut found = Vec::new();

    // A session and a run of the native API that name the ranges.
    let id = s.session(&key, &json!({"network": {"cidrs": cidrs}}));
    refused(&s.exec(&key, &id, &code), "session", &mut found);
    s.delete(&key, &id);
    let run = s.run(&key, &json!({"code": code, "network": {"cidrs": cidrs}}));
    refused(&run, "run", &mut found);
    // The server's default (what the MCP tools ask for) names them too: the operator's
    // `default` is within its bound, and opts in nothing the bound does not.
    let id = s.session(&key, &json!({"network": {"default": true}}));
    refused(&s.exec(&key, &id, &code), "default", &mut found);
    s.delete(&key, &id);

    // The E2B face: allowOut under denyOut ALL_TRAFFIC.
    let response = s
        .agent
        .post(&format!("{}/v2/sandboxes", s.url))
        .set("X-API-KEY", &key)
        .set("Content-Type", "application/json")
        .send_string(
            &json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"], "allowOut": cidrs}})
                .to_string(),
        );
    match response {
        Ok(r) => {
            let info: Value = r.into_json().unwrap();
            let id = info["sandboxID"].as_str().unwrap().to_string();
            refused(&s.exec(&key, &id, &code), "e2b", &mut found);
            s.delete(&key, &id);
        }
        Err(e) => panic!("E2B create: {e}\n{}", s.log_text()),
    }

    let seen = l.accepted();
    if seen > 0 {
        found.push(format!(
            "SANDBOX HOLE: the host's loopback listener got {seen} connection(s)"
        ));
    }
    let host = s.stop();
    verdict("a tenant's range reached internal addresses", &found, &host);
}
