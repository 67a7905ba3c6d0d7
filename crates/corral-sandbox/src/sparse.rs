//! Copies of regular files that keep their holes: only the data the source holds is read and
//! written (`lseek` with `SEEK_DATA` and `SEEK_HOLE`), at the same offsets, and the copy is then
//! given the source's size, so that a hole costs neither time nor space on either side. A
//! filesystem that does not report holes shows the whole file as data (the kernel's generic
//! `lseek`): then every byte is copied, as a plain copy would.
//!
//! Nothing here allocates: the writer child of `crate::charge` copies with it between `fork`
//! and `_exit`.

use std::os::fd::RawFd;

/// Why a copy stopped.
#[derive(Debug)]
pub(crate) enum SparseError<E> {
    /// Reading the source, or asking it where its data is, failed with this errno.
    Read(i32),
    /// Writing the copy failed with this errno (ENOSPC: no room).
    Write(i32),
    /// The source ended before the data it reported: it changed during the copy.
    Shrank,
    /// The caller's `step` refused the next chunk.
    Stopped(E),
}

/// The next stretch of data in `fd` at or after `from` and before `size`: `(start, end)`.
fn next_data(fd: RawFd, from: u64, size: u64) -> Result<Option<(u64, u64)>, i32> {
    let seek = |offset: u64, whence: i32| -> Result<Option<u64>, i32> {
        // SAFETY: lseek on a descriptor the caller owns, no memory passed.
        let at = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
        if at >= 0 {
            return Ok(Some(at as u64));
        }
        match nix::errno::Errno::last_raw() {
            // No data past `offset`.
            libc::ENXIO => Ok(None),
            errno => Err(errno),
        }
    };
    if from >= size {
        return Ok(None);
    }
    let start = match seek(from, libc::SEEK_DATA) {
        Ok(Some(start)) => start,
        Ok(None) => return Ok(None),
        // A kernel without SEEK_DATA: all of it is data.
        Err(libc::EINVAL) => return Ok(Some((from, size))),
        Err(errno) => return Err(errno),
    };
    if start >= size {
        return Ok(None);
    }
    let end = match seek(start, libc::SEEK_HOLE) {
        Ok(Some(end)) => end.min(size),
        Ok(None) | Err(libc::EINVAL) => size,
        Err(errno) => return Err(errno),
    };
    Ok(Some((start, end)))
}

/// The bytes of data (not holes) among the first `size` bytes of `fd`.
pub(crate) fn data_bytes(fd: RawFd, size: u64) -> Result<u64, i32> {
    let (mut at, mut total) = (0, 0);
    while let Some((start, end)) = next_data(fd, at, size)? {
        total += end - start;
        at = end;
    }
    Ok(total)
}

/// Copies the data among the first `size` bytes of `src` into `dst` (a new, empty file) at
/// the same offsets, through `buf`, then gives `dst` the length `size`. `step(n)` is asked
/// before each chunk of `n` bytes is written, and its error stops the copy. Returns the bytes
/// of data copied.
pub(crate) fn copy<E>(
    src: RawFd,
    dst: RawFd,
    size: u64,
    buf: &mut [u8],
    step: &mut dyn FnMut(u64) -> Result<(), E>,
) -> Result<u64, SparseError<E>> {
    let (mut at, mut copied) = (0u64, 0u64);
    while let Some((start, end)) = next_data(src, at, size).map_err(SparseError::Read)? {
        let mut offset = start;
        while offset < end {
            let want = (end - offset).min(buf.len() as u64) as usize;
            // SAFETY: `buf` is valid for writes of `want <= buf.len()` bytes.
            let n =
                unsafe { libc::pread(src, buf.as_mut_ptr().cast(), want, offset as libc::off_t) };
            if n < 0 {
                match nix::errno::Errno::last_raw() {
                    libc::EINTR => continue,
                    errno => return Err(SparseError::Read(errno)),
                }
            }
            if n == 0 {
                return Err(SparseError::Shrank);
            }
            let n = n as usize;
            step(n as u64).map_err(SparseError::Stopped)?;
            let mut done = 0;
            while done < n {
                let rest = &buf[done..n];
                // SAFETY: `rest` is valid for reads of its length.
                let w = unsafe {
                    libc::pwrite(
                        dst,
                        rest.as_ptr().cast(),
                        rest.len(),
                        (offset + done as u64) as libc::off_t,
                    )
                };
                if w < 0 {
                    match nix::errno::Errno::last_raw() {
                        libc::EINTR => continue,
                        errno => return Err(SparseError::Write(errno)),
                    }
                }
                done += w as usize;
            }
            offset += n as u64;
            copied += n as u64;
        }
        at = end;
    }
    // SAFETY: ftruncate on a descriptor the caller owns, no memory passed.
    if unsafe { libc::ftruncate(dst, size as libc::off_t) } < 0 {
        return Err(SparseError::Write(nix::errno::Errno::last_raw()));
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    /// A file of 64 MiB with 4 bytes at 0 and 6 at 32 MiB is copied as those bytes: the copy
    /// reads back the same, with the same size, and takes a few blocks; `step` sees only the
    /// data, and its refusal stops the copy.
    #[test]
    fn holes_are_neither_read_nor_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut src = std::fs::File::create_new(dir.path().join("src")).unwrap();
        src.write_all(b"head").unwrap();
        src.seek(SeekFrom::Start(32 << 20)).unwrap();
        src.write_all(b"middle").unwrap();
        src.set_len(64 << 20).unwrap();
        let src = std::fs::File::open(dir.path().join("src")).unwrap();
        assert!(data_bytes(src.as_raw_fd(), 64 << 20).unwrap() < 1 << 20);

        let dst = std::fs::File::create_new(dir.path().join("dst")).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut seen = 0;
        let copied = copy::<()>(
            src.as_raw_fd(),
            dst.as_raw_fd(),
            64 << 20,
            &mut buf,
            &mut |n| {
                seen += n;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, copied);
        assert!(copied < 1 << 20, "{copied}");
        let meta = dst.metadata().unwrap();
        assert_eq!(meta.len(), 64 << 20);
        assert!(meta.blocks() * 512 < 1 << 20, "{}", meta.blocks());
        let back = std::fs::read(dir.path().join("dst")).unwrap();
        assert_eq!(&back[..4], b"head");
        assert_eq!(&back[32 << 20..(32 << 20) + 6], b"middle");
        assert!(back[4..32 << 20].iter().all(|&b| b == 0));

        let refused = std::fs::File::create_new(dir.path().join("refused")).unwrap();
        let stopped = copy(
            src.as_raw_fd(),
            refused.as_raw_fd(),
            64 << 20,
            &mut buf,
            &mut |_| Err("enough"),
        );
        assert!(matches!(stopped, Err(SparseError::Stopped("enough"))));
    }
}
