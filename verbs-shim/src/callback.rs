//! The panic boundary of the callbacks: the functions C reaches through a pointer this library
//! put in an ops table (the context's `ibv_context_ops` and `verbs_context`, an extended QP's
//! `ibv_wr_*` builder, an extended CQ's `start_poll` / `next_poll` / `end_poll` / `read_*`).
//! They are not exported symbols, so the exported functions' helpers (`errno_call`, `ptr_call`,
//! `minus1_call`) do not cover them; [`ffi_callback!`] defines each of them behind a boundary of
//! its own, so that no panic unwinds into C from them either.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::set_errno;

/// Defines a callback for an ops table: an `unsafe extern "C" fn` whose body runs under
/// `catch_unwind`, and which returns the failure value given in `#[on_panic = ...]` when the body
/// panics (nothing unwinds into C: since Rust 1.81 an unwind out of an `extern "C" fn` aborts the
/// program). The failure expression runs after the unwind and must not panic itself.
///
/// ```ignore
/// ffi_callback! {
///     /// Doc comment of the callback.
///     #[on_panic = wr_failed(qp)]
///     fn wr_send(qp: Ours<ffi::ibv_qp_ex>) {
///         push(qp, SendOp::Send)
///     }
/// }
/// ```
///
/// A first parameter written `Ours<T>` is the object the ops table belongs to: C passes a
/// `*mut T`, and the body gets it as an [`Ours<T>`], which the module of the object turns into
/// the Rust object behind it without an `unsafe` block of its own. This macro carries that
/// justification once (see the SAFETY comment in it) in place of one comment per callback.
/// Callbacks whose first argument is checked by its module's `*_of` function (NULL and destroyed
/// objects are EINVAL there) take plain pointers.
///
/// The failure value of each kind of callback, as C expects a failure of that call:
///
/// - `c_int` ops that return an errno (`start_poll`, `next_poll`, `wr_complete`,
///   `req_notify_cq`, `dealloc_mw`, `bind_mw`, `close_xrcd`, `get_srq_num`, `query_device_ex`,
///   `query_port_ex`): EIO, with errno EIO ([`eio`]), as `errno_call` fails an exported function.
/// - `post_send`: EIO, with the first request as the bad one ([`post_failed`]), as its own
///   handling of a panic inside has it; `post_recv` and `post_srq_recv`: EIO ([`eio`]), their
///   `bad_wr` untouched, as theirs has it.
/// - `poll_cq`: -1 with errno EIO ([`minus1_eio`]), as ibv_poll_cq(3) fails.
/// - ops that create an object (`create_cq_ex`, `create_qp_ex`, `open_qp`, `create_srq_ex`,
///   `alloc_mw`, `open_xrcd`): NULL with errno EIO ([`null_eio`]).
/// - the `void` `ibv_wr_*` builders (`wr_start`, `wr_abort`, `wr_send`, ..., `wr_set_*`): the
///   failure is recorded in the QP's pending batch (EIO, unless the batch has failed already), so
///   that the batch's `ibv_wr_complete` returns it and posts nothing (`qp::wr_failed`).
/// - `end_poll` (`void`): nothing: the batch ends anyway, and the next `start_poll` starts afresh.
/// - the `read_*` accessors of an extended CQ: 0, the default of the value read.
///
/// In test builds a named callback can be made to panic before its body runs ([`PANIC_IN`]);
/// release builds carry no such failpoint.
macro_rules! ffi_callback {
    (
        $(#[doc = $doc:expr])*
        #[on_panic = $fail:expr]
        fn $name:ident($obj:ident: Ours<$oty:ty> $(, $arg:ident: $aty:ty)* $(,)?) $(-> $ret:ty)?
        $body:block
    ) => {
        $(#[doc = $doc])*
        unsafe extern "C" fn $name($obj: *mut $oty $(, $arg: $aty)*) $(-> $ret)? {
            // SAFETY: a function of this macro is reachable only through the ops tables this
            // library fills in (the context's, and the extended QP's and CQ's) for the objects it
            // makes, and libibverbs calls an op on the object whose table holds it
            // (`obj->op(obj, ...)`), which the program may not destroy during the call: `$obj` is
            // one of this library's objects, live for the call.
            let $obj = unsafe { $crate::callback::Ours::new($obj) };
            $crate::callback::boundary(stringify!($name), || $body, || $fail)
        }
    };
    (
        $(#[doc = $doc:expr])*
        #[on_panic = $fail:expr]
        fn $name:ident($($arg:ident: $aty:ty),* $(,)?) $(-> $ret:ty)?
        $body:block
    ) => {
        $(#[doc = $doc])*
        unsafe extern "C" fn $name($($arg: $aty),*) $(-> $ret)? {
            $crate::callback::boundary(stringify!($name), || $body, || $fail)
        }
    };
}

/// Runs a callback's `body`; if it panics, the callback returns `fail()` instead.
#[inline]
pub(crate) fn boundary<R>(name: &'static str, body: impl FnOnce() -> R, fail: impl FnOnce() -> R) -> R {
    let run = || {
        #[cfg(test)]
        failpoint(name);
        #[cfg(not(test))]
        let _ = name;
        body()
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(r) => r,
        Err(_) => fail(),
    }
}

/// An object of this library as the callback of its ops table receives it (see [`ffi_callback!`]):
/// only the macro makes one, and the object's module turns it into the Rust object behind it.
pub(crate) struct Ours<T>(*mut T);

impl<T> Clone for Ours<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ours<T> {}

impl<T> Ours<T> {
    /// # Safety
    /// `p` is an object this library made (the C structure at the start of its Rust object),
    /// live while the `Ours` is used.
    pub(crate) unsafe fn new(p: *mut T) -> Self {
        Ours(p)
    }

    /// The C structure, as C passed it.
    pub(crate) fn as_ptr(self) -> *mut T {
        self.0
    }
}

/// The failure of an op that returns an errno: EIO, also in errno.
pub(crate) fn eio() -> c_int {
    set_errno(libc::EIO);
    libc::EIO
}

/// The failure of `poll_cq`: -1 with errno EIO.
pub(crate) fn minus1_eio() -> c_int {
    set_errno(libc::EIO);
    -1
}

/// The failure of an op that makes an object: NULL with errno EIO.
pub(crate) fn null_eio<T>() -> *mut T {
    set_errno(libc::EIO);
    std::ptr::null_mut()
}

/// The failure of a post: EIO, with the list's first request as the one not posted.
pub(crate) fn post_failed<W>(bad: *mut *mut W, wr: *mut W) -> c_int {
    // SAFETY: the posts' contract (ibv_post_send(3), ibv_post_recv(3)): `bad` is NULL or a
    // writable slot for the request that failed.
    if let Some(b) = unsafe { bad.as_mut() } {
        *b = wr;
    }
    eio()
}

#[cfg(test)]
thread_local! {
    /// The callback (by name) that panics the next time it is called on this thread, before its
    /// body runs; it is cleared as it fires.
    pub(crate) static PANIC_IN: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
fn failpoint(name: &'static str) {
    if PANIC_IN.get() == Some(name) {
        PANIC_IN.set(None);
        panic!("failpoint: {name} panics");
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;
    use std::ptr::{null, null_mut};

    use super::*;
    use crate::ffi;

    /// A callback to call, by name.
    type Call<'a, R> = (&'static str, Box<dyn Fn() -> R + 'a>);

    /// Calls `f` with callback `name` set to panic; checks that it got to its failpoint.
    fn panicking<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
        PANIC_IN.set(Some(name));
        let r = f();
        assert_eq!(PANIC_IN.get(), None, "{name} did not reach its failpoint");
        r
    }

    fn errno() -> c_int {
        crate::last_errno()
    }

    /// Every callback of the ops tables, made to panic, fails the C way: each returns (the test
    /// goes on; without the boundary the unwind would abort the test program) with its failure
    /// value.
    #[test]
    fn every_callback_fails_the_c_way_when_it_panics() {
        let mut v = ffi::verbs_context::default();
        crate::context::fill_ops(&mut v);
        crate::cq::fill_ops(&mut v);
        crate::qp::fill_ops(&mut v);
        crate::mem::fill_ops(&mut v);
        let ops = v.context.ops;
        let c = null_mut();
        // SAFETY: every callback panics at its failpoint, before its body reads an argument.
        unsafe {
            // Ops that return an errno.
            let errno_ops: [Call<c_int>; 8] = [
                ("req_notify_cq", Box::new(|| ops.req_notify_cq.unwrap()(null_mut(), 0))),
                ("dealloc_mw", Box::new(|| ops.dealloc_mw.unwrap()(null_mut()))),
                ("bind_mw", Box::new(|| ops.bind_mw.unwrap()(null_mut(), null_mut(), null_mut()))),
                ("close_xrcd", Box::new(|| v.close_xrcd.unwrap()(null_mut()))),
                ("get_srq_num", Box::new(|| v.get_srq_num.unwrap()(null_mut(), null_mut()))),
                ("query_device_ex", Box::new(|| v.query_device_ex.unwrap()(c, null(), null_mut(), 0))),
                ("query_port_ex", Box::new(|| v.query_port.unwrap()(c, 1, null_mut(), 0))),
                ("poll_cq", Box::new(|| ops.poll_cq.unwrap()(null_mut(), 0, null_mut()))),
            ];
            for (name, call) in &errno_ops {
                crate::set_errno(0);
                let want = if *name == "poll_cq" { -1 } else { libc::EIO };
                assert_eq!(panicking(name, call), want, "{name}");
                assert_eq!(errno(), libc::EIO, "{name}");
            }
            // post_send: EIO, and the first request is the one not posted.
            let mut swr = ffi::ibv_send_wr::default();
            let mut sbad = null_mut();
            let r = panicking("post_send", || ops.post_send.unwrap()(null_mut(), &mut swr, &mut sbad));
            assert_eq!((r, sbad), (libc::EIO, &mut swr as *mut _));
            let mut rwr = ffi::ibv_recv_wr::default();
            let mut rbad = null_mut();
            let r = panicking("post_recv", || ops.post_recv.unwrap()(null_mut(), &mut rwr, &mut rbad));
            assert_eq!(r, libc::EIO);
            let r = panicking("post_srq_recv", || ops.post_srq_recv.unwrap()(null_mut(), &mut rwr, &mut rbad));
            assert_eq!(r, libc::EIO);
            // Ops that make an object: NULL, errno EIO.
            let made: [Call<*mut c_void>; 6] = [
                ("create_cq_ex", Box::new(|| v.create_cq_ex.unwrap()(c, null_mut()).cast())),
                ("create_qp_ex", Box::new(|| v.create_qp_ex.unwrap()(c, null_mut()).cast())),
                ("open_qp", Box::new(|| v.open_qp.unwrap()(c, null_mut()).cast())),
                ("create_srq_ex", Box::new(|| v.create_srq_ex.unwrap()(c, null_mut()).cast())),
                ("alloc_mw", Box::new(|| ops.alloc_mw.unwrap()(null_mut(), ffi::IBV_MW_TYPE_1).cast())),
                ("open_xrcd", Box::new(|| v.open_xrcd.unwrap()(c, null_mut()).cast())),
            ];
            for (name, call) in &made {
                crate::set_errno(0);
                assert!(panicking(name, call).is_null(), "{name}");
                assert_eq!(errno(), libc::EIO, "{name}");
            }
        }
        extended_cq(&mut crate::cq::unbacked());
        extended_qp(&mut crate::qp::unbacked());
    }

    /// An extended CQ's callbacks: EIO from start_poll and next_poll, nothing from end_poll, 0
    /// from every accessor.
    fn extended_cq(c: &mut crate::cq::Cq) {
        let ex = c.ex;
        let cq = c as *mut crate::cq::Cq as *mut ffi::ibv_cq_ex;
        // SAFETY: `cq` is a Cq (with no device CQ behind it); each callback panics at its
        // failpoint, before its body reads an argument.
        unsafe {
            assert_eq!(panicking("start_poll", || ex.start_poll.unwrap()(cq, null_mut())), libc::EIO);
            assert_eq!(panicking("next_poll", || ex.next_poll.unwrap()(cq)), libc::EIO);
            panicking("end_poll", || ex.end_poll.unwrap()(cq));
            let reads: [(&str, unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u32); 7] = [
                ("read_opcode", ex.read_opcode.unwrap()),
                ("read_vendor_err", ex.read_vendor_err.unwrap()),
                ("read_byte_len", ex.read_byte_len.unwrap()),
                ("read_imm_data", ex.read_imm_data.unwrap()),
                ("read_qp_num", ex.read_qp_num.unwrap()),
                ("read_src_qp", ex.read_src_qp.unwrap()),
                ("read_wc_flags", ex.read_wc_flags.unwrap()),
            ];
            for (name, read) in reads {
                assert_eq!(panicking(name, || read(cq)), 0, "{name}");
            }
            let reads8: [(&str, unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u8); 2] =
                [("read_sl", ex.read_sl.unwrap()), ("read_dlid_path_bits", ex.read_dlid_path_bits.unwrap())];
            for (name, read) in reads8 {
                assert_eq!(panicking(name, || read(cq)), 0, "{name}");
            }
            assert_eq!(panicking("read_slid", || ex.read_slid.unwrap()(cq)), 0);
        }
    }

    /// An extended QP's callbacks: a panicking ibv_wr_* builder leaves EIO in the batch, which
    /// the batch's ibv_wr_complete returns; a panicking ibv_wr_complete returns EIO.
    fn extended_qp(q: &mut crate::qp::Qp) {
        let ex = q.ex;
        let qp = q as *mut crate::qp::Qp as *mut ffi::ibv_qp_ex;
        // SAFETY: `qp` is a Qp (with no device QP behind it); each builder panics at its
        // failpoint, before its body reads an argument, and ibv_wr_complete of a failed batch
        // returns before it reaches the device QP.
        unsafe {
            let builders: [Call<()>; 20] = [
                ("wr_start", Box::new(|| ex.wr_start.unwrap()(qp))),
                ("wr_abort", Box::new(|| ex.wr_abort.unwrap()(qp))),
                ("wr_send", Box::new(|| ex.wr_send.unwrap()(qp))),
                ("wr_send_imm", Box::new(|| ex.wr_send_imm.unwrap()(qp, 1))),
                ("wr_send_inv", Box::new(|| ex.wr_send_inv.unwrap()(qp, 1))),
                ("wr_rdma_write", Box::new(|| ex.wr_rdma_write.unwrap()(qp, 1, 2))),
                ("wr_rdma_write_imm", Box::new(|| ex.wr_rdma_write_imm.unwrap()(qp, 1, 2, 3))),
                ("wr_rdma_read", Box::new(|| ex.wr_rdma_read.unwrap()(qp, 1, 2))),
                ("wr_atomic_cmp_swp", Box::new(|| ex.wr_atomic_cmp_swp.unwrap()(qp, 1, 2, 3, 4))),
                ("wr_atomic_fetch_add", Box::new(|| ex.wr_atomic_fetch_add.unwrap()(qp, 1, 2, 3))),
                ("wr_atomic_write", Box::new(|| ex.wr_atomic_write.unwrap()(qp, 1, 2, null()))),
                ("wr_local_inv", Box::new(|| ex.wr_local_inv.unwrap()(qp, 1))),
                ("wr_bind_mw", Box::new(|| ex.wr_bind_mw.unwrap()(qp, null_mut(), 1, null()))),
                ("wr_set_sge", Box::new(|| ex.wr_set_sge.unwrap()(qp, 1, 2, 3))),
                ("wr_set_sge_list", Box::new(|| ex.wr_set_sge_list.unwrap()(qp, 0, null()))),
                ("wr_set_inline_data", Box::new(|| ex.wr_set_inline_data.unwrap()(qp, null_mut(), 0))),
                ("wr_set_inline_data_list", Box::new(|| ex.wr_set_inline_data_list.unwrap()(qp, 0, null()))),
                ("wr_set_ud_addr", Box::new(|| ex.wr_set_ud_addr.unwrap()(qp, null_mut(), 1, 2))),
                ("wr_set_xrc_srqn", Box::new(|| ex.wr_set_xrc_srqn.unwrap()(qp, 1))),
                ("wr_complete", Box::new(|| assert_eq!(ex.wr_complete.unwrap()(qp), libc::EIO))),
            ];
            for (name, call) in &builders {
                ex.wr_start.unwrap()(qp);
                crate::set_errno(0);
                panicking(name, call);
                if *name == "wr_complete" {
                    assert_eq!(errno(), libc::EIO);
                } else {
                    assert_eq!(ex.wr_complete.unwrap()(qp), libc::EIO, "the batch after a panic in {name}");
                }
            }
        }
    }

    /// A boundary gives its body's value, or on a panic its failure's (for a `()` body too: the
    /// failure runs, as a builder's records its error).
    #[test]
    fn a_panicking_body_gives_the_failure_value() {
        assert_eq!(boundary("none", || 5, || 7), 5);
        assert_eq!(boundary("none", || -> i32 { panic!("inside") }, || 7), 7);
        let mut failed = false;
        boundary("none", || panic!("inside"), || failed = true);
        assert!(failed);
    }

    /// Every `extern "C" fn` defined in this crate is either exported (`#[no_mangle]`, behind the
    /// exported functions' own boundary) or defined by [`ffi_callback!`]: a callback written by
    /// hand would have no panic boundary.
    #[test]
    fn no_callback_is_defined_outside_the_macro() {
        let mut files = vec![];
        let mut dirs = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    files.push(p);
                }
            }
        }
        assert!(files.len() > 10);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, l) in lines.iter().enumerate() {
                let Some(at) = l.find("extern \"C\" fn ") else { continue };
                let name = &l[at + "extern \"C\" fn ".len()..];
                if name.starts_with('$') && f.ends_with("callback.rs") {
                    continue; // this macro's own definition
                }
                // The attributes and comments above the definition.
                let above = lines[..i]
                    .iter()
                    .rev()
                    .map(|l| l.trim())
                    .take_while(|l| l.starts_with("#[") || l.starts_with("//"));
                assert!(
                    above.clone().any(|l| l == "#[no_mangle]"),
                    "{}:{}: an extern \"C\" fn that is neither exported nor an ffi_callback!",
                    f.display(),
                    i + 1
                );
            }
        }
    }
}
