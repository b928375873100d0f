//! The capture file as the writer appends to it: records gather in a block-aligned staging buffer
//! and leave in whole blocks after each batch the writer takes. A regular file is opened with
//! `O_DIRECT` where its file system takes it, and the whole blocks of the buffer go to it without a
//! copy into the page cache: on this 2-core machine a buffered write costs ~0.36 s of CPU per GB
//! (tmpfs or disk), a direct one to the disk ~0.06 s, and buffered writes to the disk settle at the
//! rate its writeback keeps (~350 MB/s here) where direct ones reach ~2.7 GB/s (BENCHMARKS.md, "The
//! capture"). What is left of the last block when the writer goes idle or the capture ends goes
//! through the page cache (`O_DIRECT` lifted for that one write), so the file ends with the last
//! whole record without ever being cut back; the next direct write of that block, once it is whole,
//! supersedes it (the kernel writes back and drops the cached block first). Anything else (a FIFO,
//! a character device, a memory file system, a file system that refuses `O_DIRECT` or its
//! alignment) is written plainly, in order, each batch of records with one `writev` from the rings.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// The alignment and size unit of direct writes: the largest logical block size in common use
/// (a file system with a larger one refuses the write, and the sink falls back to plain writes).
const BLOCK: usize = 4096;
/// The staging buffer: records gather here until a round ends or it is full.
const STAGING: usize = 4 << 20;

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
    /// Of those, the first `written` are on the file already (the last partial block, written
    /// through the page cache; written again, directly, once whole).
    written: usize,
    /// The file offset of `buf[0]` (block-aligned while direct).
    base: u64,
    /// Frames appended and not counted yet.
    frames: u64,
}

impl Sink {
    /// Creates (truncates) the file at `path` with `header` as its first bytes.
    pub(crate) fn create(path: &Path, header: &[u8]) -> io::Result<Sink> {
        let regular = std::fs::metadata(path).map_or(true, |m| m.file_type().is_file());
        let direct_file = if regular && !direct_off() {
            OpenOptions::new().write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(path).ok()
        } else {
            None
        };
        // A memory file system takes O_DIRECT but copies into memory all the same: plain
        // `writev`s straight from the rings cost one copy less there than staging.
        let direct_file = direct_file.filter(|f| !in_memory(f));
        let direct = direct_file.is_some();
        let file = match direct_file {
            Some(f) => f,
            None => File::create(path)?,
        };
        let mut sink = Sink { file, direct, buf: Aligned::new(STAGING), len: 0, written: 0, base: 0, frames: 0 };
        sink.append(header, 0).map_err(|(e, _)| e)?;
        Ok(sink)
    }

    /// Whether the file is written with `O_DIRECT`.
    #[cfg(test)]
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// Appends `bytes` (holding `frames` frames), writing the staged blocks whenever the
    /// buffer fills. Returns the frames now counted written, or the error and the frames lost.
    pub(crate) fn append(&mut self, mut bytes: &[u8], frames: u64) -> Result<u64, (io::Error, u64)> {
        let mut counted = 0;
        while !bytes.is_empty() {
            let n = (STAGING - self.len).min(bytes.len());
            if n == 0 {
                // (Counts the frames staged before these bytes.)
                let r = self.write_blocks();
                counted += self.settle(r).map_err(|(e, lost)| (e, lost + frames))?;
                continue;
            }
            let at = self.len;
            softrdma_engine::copy::copy_bytes(&mut self.buf.bytes()[at..at + n], &bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
        }
        self.frames += frames;
        Ok(counted)
    }

    /// Writes a batch of records (holding `frames` frames): on a plain file at once, with one
    /// `writev` from where they are; on a direct one through the staging buffer. Returns the
    /// frames counted written, or the error and the frames lost.
    pub(crate) fn write_batch(&mut self, slices: &mut [IoSlice<'_>], frames: u64) -> Result<u64, (io::Error, u64)> {
        if self.direct {
            let mut counted = 0;
            for (k, sl) in slices.iter().enumerate() {
                counted += self.append(sl, 1).map_err(|(e, lost)| (e, lost + frames - k as u64 - 1))?;
            }
            return Ok(counted);
        }
        // Anything staged (the file's header) goes first.
        let r = self.write_blocks().and_then(|()| write_all_vectored(&self.file, slices));
        match r {
            Ok(()) => {
                self.base += slices.iter().map(|s| s.len() as u64).sum::<u64>();
                Ok(std::mem::take(&mut self.frames) + frames)
            }
            Err(e) => Err((e, std::mem::take(&mut self.frames) + frames)),
        }
    }

    /// Writes what is staged: the whole blocks (direct) or everything (plain); with `all` (the
    /// writer is idle, or the capture ends) the last partial block too. Returns the frames
    /// counted written, or the error and the frames lost.
    pub(crate) fn flush(&mut self, all: bool) -> Result<u64, (io::Error, u64)> {
        let mut r = self.write_blocks();
        if r.is_ok() && all && self.direct && self.len > self.written {
            r = self.write_tail();
        }
        self.settle(r)
    }

    fn settle(&mut self, r: io::Result<()>) -> Result<u64, (io::Error, u64)> {
        let n = std::mem::take(&mut self.frames);
        match r {
            Ok(()) => Ok(n),
            Err(e) => {
                // What was staged is lost; the file keeps every whole record before it.
                self.len = self.written;
                Err((e, n))
            }
        }
    }

    /// Writes the staged bytes up to the last whole block (direct; the partial block stays
    /// staged), or all of them (plain).
    fn write_blocks(&mut self) -> io::Result<()> {
        if !self.direct {
            let (from, len) = (self.written, self.len);
            (&self.file).write_all(&self.buf.bytes()[from..len])?;
            self.base += len as u64;
            (self.len, self.written) = (0, 0);
            return Ok(());
        }
        let whole = self.len - self.len % BLOCK;
        if whole == 0 {
            return Ok(());
        }
        match write_all_at(&self.file, &self.buf.bytes()[..whole], self.base) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.fall_back()?;
                return self.write_blocks();
            }
            Err(e) => return Err(e),
        }
        let len = self.len;
        self.buf.bytes().copy_within(whole..len, 0);
        self.base += whole as u64;
        self.len -= whole;
        self.written = 0;
        Ok(())
    }

    /// Direct: writes the staged partial block through the page cache (`O_DIRECT` lifted for
    /// that write); it stays staged, to be written directly once whole.
    fn write_tail(&mut self) -> io::Result<()> {
        let (from, len) = (self.written, self.len);
        set_direct(&self.file, false)?;
        let r = write_all_at(&self.file, &self.buf.bytes()[from..len], self.base + from as u64);
        set_direct(&self.file, true)?;
        r?;
        self.written = len;
        Ok(())
    }

    /// Leaves `O_DIRECT` for good: the file is written plainly, in order, from the end of what
    /// is on it.
    fn fall_back(&mut self) -> io::Result<()> {
        use std::io::Seek;
        set_direct(&self.file, false)?;
        self.direct = false;
        (&self.file).seek(io::SeekFrom::Start(self.base + self.written as u64))?;
        tracing::debug!("capture file: O_DIRECT writes refused; writing through the page cache");
        Ok(())
    }
}

/// Whether `f` is on tmpfs or ramfs.
fn in_memory(f: &File) -> bool {
    use nix::sys::statfs::{fstatfs, FsType, TMPFS_MAGIC};
    // ramfs's magic (linux/magic.h), which nix does not name.
    const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);
    fstatfs(f).is_ok_and(|s| s.filesystem_type() == TMPFS_MAGIC || s.filesystem_type() == RAMFS_MAGIC)
}

fn set_direct(f: &File, on: bool) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(f, FcntlArg::F_GETFL).map_err(io::Error::from)?);
    let flags = if on { flags | OFlag::O_DIRECT } else { flags & !OFlag::O_DIRECT };
    fcntl(f, FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(())
}

/// `$SOFTRDMA_CAPTURE_DIRECT=0` writes the capture through the page cache (a tuning knob, to
/// compare).
fn direct_off() -> bool {
    std::env::var("SOFTRDMA_CAPTURE_DIRECT").is_ok_and(|v| v == "0")
}

fn write_all_vectored(mut f: &File, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !bufs.is_empty() {
        match f.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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

    /// Whatever the mode, after each flush of everything the file holds exactly the bytes
    /// appended, and after a flush of whole blocks a prefix of them; the frames are counted.
    #[test]
    fn the_file_holds_exactly_what_was_appended() {
        for direct in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.pcap");
            let header = b"HEADER-24-BYTES-LONG....";
            let mut s = Sink::create(&path, header).unwrap();
            if !direct && s.is_direct() {
                s.fall_back().unwrap();
            }
            let mut want = header.to_vec();
            let mut counted = 0;
            for (k, n) in [10usize, 4096, 5000, 1, 70_000, 4072, 3, 1 << 20, 5 << 20, 8192].into_iter().enumerate() {
                let data: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(k as u8)).collect();
                counted += s.append(&data, 1).unwrap();
                want.extend_from_slice(&data);
                counted += s.flush(false).unwrap();
                let on_file = std::fs::read(&path).unwrap();
                assert!(want.starts_with(&on_file), "a prefix after a flush of whole blocks");
                assert!(want.len() - on_file.len() < BLOCK);
                counted += s.flush(true).unwrap();
                assert_eq!(std::fs::read(&path).unwrap(), want, "direct {} after {n}", s.is_direct());
            }
            for i in 0..100u32 {
                let data = vec![i as u8; 777 + i as usize];
                counted += s.append(&data, 1).unwrap();
                want.extend_from_slice(&data);
            }
            // Batches, as the writer hands them over.
            for b in 0..20u32 {
                let recs: Vec<Vec<u8>> =
                    (0..30).map(|k| vec![(b * 30 + k) as u8; 100 + (b * 977 + k * 131) as usize % 9000]).collect();
                let mut slices: Vec<IoSlice<'_>> = recs.iter().map(|r| IoSlice::new(r)).collect();
                counted += s.write_batch(&mut slices, recs.len() as u64).unwrap();
                recs.iter().for_each(|r| want.extend_from_slice(r));
                if b % 7 == 0 {
                    counted += s.flush(b % 2 == 0).unwrap();
                }
            }
            counted += s.flush(true).unwrap();
            assert_eq!(s.flush(true).unwrap(), 0, "nothing new");
            assert_eq!(std::fs::read(&path).unwrap(), want);
            assert_eq!(counted, 110 + 20 * 30);
        }
    }
}
