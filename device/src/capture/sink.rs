//! The capture file as the writer appends to it: records are gathered in a staging buffer and
//! leave in large writes. A regular file is opened with `O_DIRECT` where its file system takes
//! it, and written in whole blocks from the (block-aligned) buffer: the kernel moves the bytes to
//! the device without copying them into the page cache, which on a 2-core machine cost the
//! writer ~0.36 s of CPU per GB (BENCHMARKS.md, "The capture"), and a disk's writeback does not
//! throttle the writer (buffered writes to this machine's disk settle at ~350 MB/s, direct ones
//! at ~2.7 GB/s). The last, partial block is written padded with zeros and the file cut back to
//! its length, so the file always ends with the last whole record written; the next write
//! rewrites that block with what followed. Anything else (a FIFO, a character device, a file
//! system that refuses `O_DIRECT` or its alignment) is written plainly, in order.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;

/// The alignment and size unit of direct writes: the largest logical block size in common use
/// (a file system with a larger one refuses the write, and the sink falls back to plain writes).
const BLOCK: usize = 4096;
/// The staging buffer: records gather here until a round ends or it is full.
pub(crate) const STAGING: usize = 4 << 20;

/// A block-aligned, zeroed heap buffer.
struct Aligned {
    ptr: NonNull<u8>,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, BLOCK).expect("valid layout");
        // SAFETY: the layout's size is not zero (STAGING).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Aligned { ptr, len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialized bytes (zeroed at allocation), owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, BLOCK).expect("valid layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

// SAFETY: the buffer is owned memory, used by one thread at a time (`&mut self`).
unsafe impl Send for Aligned {}

/// The capture file and its staging buffer.
pub(crate) struct Sink {
    file: File,
    /// Written in whole blocks with `O_DIRECT` (else plainly, in order).
    direct: bool,
    buf: Aligned,
    /// Bytes in `buf`.
    len: usize,
    /// Of those, the first `carried` are on the file already (the last partial block, which the
    /// next direct write writes again).
    carried: usize,
    /// The file offset of `buf[0]` (block-aligned while direct).
    base: u64,
    /// Frames in `buf` not written yet.
    frames: u64,
}

impl Sink {
    /// Creates (truncates) the file at `path` with `header` as its first bytes (not written until
    /// the first [`Sink::flush`]).
    pub(crate) fn create(path: &Path, header: &[u8]) -> io::Result<Sink> {
        let regular = std::fs::metadata(path).map_or(true, |m| m.file_type().is_file());
        let direct_file = if regular && !direct_off() {
            OpenOptions::new().write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(path).ok()
        } else {
            None
        };
        let direct = direct_file.is_some();
        let file = match direct_file {
            Some(f) => f,
            None => File::create(path)?,
        };
        let mut sink = Sink { file, direct, buf: Aligned::new(STAGING), len: 0, carried: 0, base: 0, frames: 0 };
        sink.stage(header.len()).copy_from_slice(header);
        Ok(sink)
    }

    /// Whether the file is written with `O_DIRECT`.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// Room left in the staging buffer.
    pub(crate) fn room(&self) -> usize {
        // Direct writes round the end up to a block: keep that padding inside the buffer.
        STAGING - self.len.next_multiple_of(BLOCK).min(STAGING)
    }

    /// `n` bytes at the end of the staging buffer for the caller to fill (`n <= room()`).
    pub(crate) fn stage(&mut self, n: usize) -> &mut [u8] {
        let at = self.len;
        self.len += n;
        &mut self.buf.bytes()[at..at + n]
    }

    /// Counts one frame staged.
    pub(crate) fn staged_frame(&mut self) {
        self.frames += 1;
    }

    /// Writes what is staged. Returns the frames it wrote, or the error and the frames lost.
    pub(crate) fn flush(&mut self) -> Result<u64, (io::Error, u64)> {
        if self.len == self.carried {
            return Ok(0);
        }
        let r = if self.direct { self.write_direct() } else { self.write_plain() };
        let n = std::mem::take(&mut self.frames);
        match r {
            Ok(()) => Ok(n),
            Err(e) => {
                // What was staged is lost; the file keeps every whole record before it.
                self.len = self.carried;
                Err((e, n))
            }
        }
    }

    fn write_direct(&mut self) -> io::Result<()> {
        let (len, base) = (self.len, self.base);
        let padded = len.next_multiple_of(BLOCK);
        let buf = self.buf.bytes();
        buf[len..padded].fill(0);
        match write_all_at(&self.file, &buf[..padded], base) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // The file system wants another alignment: plain writes from here on.
                self.fall_back()?;
                return self.write_plain();
            }
            Err(e) => return Err(e),
        }
        if padded != len {
            self.file.set_len(base + len as u64)?;
        }
        // The last partial block stays staged, to be written again with what follows it.
        let whole = len - len % BLOCK;
        let buf = self.buf.bytes();
        buf.copy_within(whole..len, 0);
        self.base += whole as u64;
        self.len = len - whole;
        self.carried = self.len;
        Ok(())
    }

    fn write_plain(&mut self) -> io::Result<()> {
        let len = self.len;
        let from = self.carried;
        let buf = &self.buf.bytes()[from..len];
        let mut f = &self.file;
        f.write_all(buf)?;
        self.base += len as u64;
        self.len = 0;
        self.carried = 0;
        Ok(())
    }

    /// Leaves `O_DIRECT`: the file is rewound to the end of what is on it and written plainly.
    fn fall_back(&mut self) -> io::Result<()> {
        use std::io::Seek;
        let flags = nix::fcntl::fcntl(&self.file, nix::fcntl::FcntlArg::F_GETFL).map_err(io::Error::from)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) & !nix::fcntl::OFlag::O_DIRECT;
        nix::fcntl::fcntl(&self.file, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
        self.direct = false;
        // The carried bytes are on the file: continue after them.
        let end = self.base + self.carried as u64;
        self.file.set_len(end)?;
        (&self.file).seek(io::SeekFrom::Start(end))?;
        tracing::debug!("capture file: O_DIRECT writes refused; writing through the page cache");
        Ok(())
    }
}

/// `$SOFTRDMA_CAPTURE_DIRECT=0` writes the capture through the page cache (a tuning knob, to
/// compare).
fn direct_off() -> bool {
    std::env::var("SOFTRDMA_CAPTURE_DIRECT").is_ok_and(|v| v == "0")
}

fn write_all_at(f: &File, mut buf: &[u8], mut at: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match f.write_at(buf, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(s: &mut Sink, n: usize, byte: u8) {
        s.stage(n).fill(byte);
        s.staged_frame();
    }

    /// Whatever the mode, the file holds exactly the bytes staged, after every flush; a FIFO-like
    /// target (plain) and a regular file (direct where the file system takes it) alike.
    #[test]
    fn the_file_holds_exactly_what_was_staged_after_each_flush() {
        for direct in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.pcap");
            let mut s = Sink::create(&path, b"HEADER-24-BYTES-LONG....").unwrap();
            if !direct && s.is_direct() {
                s.fall_back().unwrap();
            }
            let mut want = b"HEADER-24-BYTES-LONG....".to_vec();
            let mut k = 0u8;
            for n in [10usize, 4096, 5000, 1, 70_000, 4072, 3, 1 << 20] {
                while s.room() < n {
                    s.flush().unwrap();
                }
                k = k.wrapping_add(1);
                fill(&mut s, n, k);
                want.extend(std::iter::repeat_n(k, n));
                assert_eq!(s.flush().unwrap(), 1);
                assert_eq!(std::fs::read(&path).unwrap(), want, "direct {} after {n}", s.is_direct());
            }
            // Many frames staged, then one flush.
            for _ in 0..100 {
                fill(&mut s, 777, 9);
                want.extend(std::iter::repeat_n(9u8, 777));
            }
            assert_eq!(s.flush().unwrap(), 100);
            assert_eq!(s.flush().unwrap(), 0, "nothing new");
            assert_eq!(std::fs::read(&path).unwrap(), want);
        }
    }

    #[test]
    fn room_keeps_the_padding_of_a_direct_write_inside_the_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sink::create(&dir.path().join("c.pcap"), &[0; 24]).unwrap();
        while s.room() > 0 {
            let n = s.room().min(10_000);
            s.stage(n);
        }
        assert!(s.len <= STAGING);
        s.flush().unwrap();
        assert!(s.room() >= STAGING - BLOCK);
    }
}
