//! placeholder while compiling
use super::opts::Addr;
use super::Iov;
use crate::Errno;
use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicI32;
pub(crate) struct Dgram {
    pub(super) fs_flags: AtomicI32,
    pub(super) fd_flags: AtomicI32,
}
impl Dgram {
    pub(super) fn new(_d: c_int, _f: c_int, _g: c_int) -> Result<Dgram, Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn fd(&self) -> c_int {
        -1
    }
    pub(super) fn bind(&self, _a: &Addr, _l: libc::socklen_t) -> Result<(), Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn connect(&self, _a: &Addr, _l: libc::socklen_t) -> Result<(), Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn shutdown(&self) {}
    pub(super) fn close(&self) {}
    pub(super) fn recv(
        &self,
        _i: &Iov,
        _f: c_int,
        _from: Option<(*mut libc::sockaddr, *mut libc::socklen_t)>,
    ) -> Result<usize, Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn send(
        &self,
        _i: &Iov,
        _f: c_int,
        _to: Option<(*const libc::sockaddr, libc::socklen_t)>,
    ) -> Result<usize, Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn peer_name(&self, _a: *mut libc::sockaddr, _l: *mut libc::socklen_t) -> Result<(), Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn sock_name(&self, _a: *mut libc::sockaddr, _l: *mut libc::socklen_t) -> Result<(), Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn setsockopt(
        &self,
        _l: c_int,
        _n: c_int,
        _v: *const c_void,
        _len: libc::socklen_t,
    ) -> Result<(), Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn getsockopt(
        &self,
        _l: c_int,
        _n: c_int,
        _v: *mut c_void,
        _len: *mut libc::socklen_t,
    ) -> Result<(), Errno> {
        Err(Errno(libc::ENOTSUP))
    }
    pub(super) fn revents(&self, _e: i16, _a: bool) -> i16 {
        0
    }
    pub(super) fn waits(&self, _o: &mut Vec<libc::pollfd>) {}
    pub(super) fn take_events(&self) -> bool {
        false
    }
}
