//! Devices: `ibv_get_device_list` finds the running softrdma devices (their sockets in the
//! runtime directory) and starts the default one when none runs; the `ibv_device` structures
//! live as long as the process, as libibverbs' do.

use std::ffi::{c_char, c_int, CStr};
use std::path::PathBuf;
use std::sync::Mutex;

use softrdma_device::proto::DeviceInfo;
use softrdma_device::{client::Connection, runtime};

use crate::ffi;
use crate::{minus1_call, nonnull, ptr_call, set_errno, Errno};

/// The device started when a program finds none running (as `softrdma exec` would start it).
pub(crate) const DEFAULT_DEVICE: &str = "srdma0";
const DEFAULT_ADDR: &str = "127.0.0.1";

/// An `ibv_device` and what the shim knows of it.
#[repr(C)]
pub(crate) struct Dev {
    pub(crate) dev: ffi::ibv_device,
    pub(crate) name: String,
    pub(crate) info: DeviceInfo,
}

// SAFETY: the C structure holds no pointers; the device list is read-only once made.
unsafe impl Send for Dev {}
unsafe impl Sync for Dev {}

/// Every device this process has seen, by name (never freed: `ibv_device` pointers stay valid).
static DEVICES: Mutex<Vec<&'static Dev>> = Mutex::new(Vec::new());

fn copy_cstr(dst: &mut [c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
        *d = b as c_char;
    }
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
}

fn make_dev(index: usize, name: &str, info: DeviceInfo) -> &'static Dev {
    let mut dev =
        ffi::ibv_device { node_type: ffi::IBV_NODE_CA, transport_type: ffi::IBV_TRANSPORT_IB, ..Default::default() };
    copy_cstr(&mut dev.name, name);
    copy_cstr(&mut dev.dev_name, &format!("uverbs{index}"));
    copy_cstr(&mut dev.dev_path, &format!("/sys/class/infiniband_verbs/uverbs{index}"));
    copy_cstr(&mut dev.ibdev_path, &format!("/sys/class/infiniband/{name}"));
    Box::leak(Box::new(Dev { dev, name: name.to_owned(), info }))
}

/// The directory this library was loaded from (the shim directory: `softrdma` is one level up
/// in a cargo target dir).
fn shim_dir() -> Option<PathBuf> {
    // SAFETY: Dl_info is two C strings and two addresses (raw pointers): all-zero is NULLs.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and fills `info`.
    let ok = unsafe { libc::dladdr(shim_dir as *const libc::c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gives a NUL-terminated path that lives as long as the library.
    let path = PathBuf::from(unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?);
    let path = std::fs::canonicalize(path).ok()?;
    path.parent().map(|p| p.to_owned())
}

/// The `softrdma` executable: $SOFTRDMA_BIN, else beside the shim directory, else on PATH.
fn softrdma_exe() -> PathBuf {
    if let Some(p) = std::env::var_os("SOFTRDMA_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(d) = shim_dir() {
        for cand in [d.join("softrdma"), d.join("../softrdma")] {
            if cand.is_file() {
                return cand;
            }
        }
    }
    PathBuf::from("softrdma")
}

/// Starts the default device (srdma0 on 127.0.0.1, or $SOFTRDMA_DEFAULT_ADDR) unless
/// $SOFTRDMA_NO_AUTOSTART is set.
fn start_default() {
    if std::env::var_os("SOFTRDMA_NO_AUTOSTART").is_some() {
        return;
    }
    let exe = softrdma_exe();
    let addr = std::env::var("SOFTRDMA_DEFAULT_ADDR").unwrap_or_else(|_| DEFAULT_ADDR.to_owned());
    // An autostarted device ends after AUTOSTART_IDLE_EXIT with no client.
    let idle = softrdma_device::daemon::AUTOSTART_IDLE_EXIT.as_secs().to_string();
    let args = vec!["--addr".to_owned(), addr, "--idle-exit".to_owned(), idle];
    if let Err(e) = softrdma_device::daemon::up(&exe, DEFAULT_DEVICE, &args) {
        eprintln!("softrdma: no device is running and starting {DEFAULT_DEVICE} with {} failed: {e}", exe.display());
    }
}

/// The running devices, in name order.
pub(crate) fn discover() -> Result<Vec<&'static Dev>, Errno> {
    let dir = runtime::runtime_dir().map_err(|e| {
        eprintln!("softrdma: {e}");
        Errno(libc::ENOSYS)
    })?;
    let mut names = runtime::list_devices(&dir);
    if names.is_empty() {
        start_default();
        names = runtime::list_devices(&dir);
    }
    let mut known = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::new();
    for name in names {
        if let Some(d) = known.iter().find(|d| d.name == name) {
            out.push(*d);
            continue;
        }
        let conn = match Connection::connect_in(&dir, &name) {
            Ok(c) => c,
            Err(e) => {
                // Say why a running device is left out (another build's protocol, another user).
                eprintln!("softrdma: device {name} is not usable: {e}");
                continue;
            }
        };
        let d = make_dev(known.len(), &name, conn.info.clone());
        known.push(d);
        out.push(d);
    }
    Ok(out)
}

/// The shim's device behind an `ibv_device` pointer.
pub(crate) fn dev_of<'a>(p: *mut ffi::ibv_device) -> Result<&'a Dev, Errno> {
    let d = nonnull(p)?;
    let known = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let found = known.iter().find(|k| std::ptr::eq(&k.dev, d)).copied();
    found.ok_or(Errno(libc::ENODEV))
}

/// The node GUID as libibverbs stores it (network order).
pub(crate) fn guid_be(info: &DeviceInfo) -> u64 {
    info.node_guid.to_be()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ffi::ibv_device {
    let r = ptr_call(|| {
        let devs = discover()?;
        let mut list: Vec<*mut ffi::ibv_device> =
            devs.iter().map(|d| &d.dev as *const ffi::ibv_device as *mut ffi::ibv_device).collect();
        let n = list.len();
        list.push(std::ptr::null_mut());
        // SAFETY: ibv_get_device_list(3): `num` is NULL or points to an int the caller lets us
        // write.
        if let Some(num) = unsafe { num.as_mut() } {
            *num = n as c_int;
        }
        Ok(Box::into_raw(list.into_boxed_slice()) as *mut *mut ffi::ibv_device)
    });
    if r.is_null() {
        // SAFETY: as above, `num` is NULL or a writable int.
        if let Some(num) = unsafe { num.as_mut() } {
            *num = 0;
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ffi::ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: ibv_free_device_list(3): `list` is an array ibv_get_device_list returned, which ends
    // with the NULL entry it put there, so every entry up to that one is in bounds.
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: ibv_get_device_list made `list` with Box::into_raw from a boxed slice of exactly
    // n + 1 entries (the devices and the NULL), and the caller frees it once.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ffi::ibv_device) -> *const c_char {
    // SAFETY: `dev` is NULL or an entry of a list from ibv_get_device_list; the devices it points
    // to are never freed (DEVICES keeps them for the life of the process).
    match unsafe { dev.as_ref() } {
        Some(d) => d.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ffi::ibv_device) -> u64 {
    match dev_of(dev) {
        Ok(d) => guid_be(&d.info),
        Err(Errno(e)) => {
            set_errno(e);
            0
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ffi::ibv_device) -> c_int {
    minus1_call(|| {
        let d = dev_of(dev)?;
        let known = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        Ok(known.iter().position(|k| std::ptr::eq(*k, d)).unwrap_or(0) as c_int)
    })
}

/// `ibv_read_sysfs_file`: the few files of the device's sysfs directory programs read
/// (ibv_devinfo: board_id, fw_ver, node_type...), answered from the device; anything else is
/// ENOENT, as a missing sysfs file is.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    minus1_call(|| {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return Err(Errno(libc::EINVAL));
        }
        // SAFETY: `dir` and `file` are non-NULL (checked) NUL-terminated paths, as
        // ibv_read_sysfs_file's callers in rdma-core pass them.
        let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let dir = dir.to_string_lossy().into_owned();
        let file = file.to_string_lossy().into_owned();
        let known = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        let dev = known.iter().find(|d| dir.trim_end_matches('/') == format!("/sys/class/infiniband/{}", d.name));
        let text = match (dev, file.as_str()) {
            (Some(_), "board_id") => "softrdma".to_owned(),
            (Some(_), "fw_ver") => env!("CARGO_PKG_VERSION").to_owned(),
            (Some(_), "hw_rev") => "0".to_owned(),
            (Some(_), "hca_type") => "softrdma".to_owned(),
            (Some(_), "node_type") => "1: CA".to_owned(),
            (Some(d), "node_guid") => guid_text(d.info.node_guid),
            (Some(d), "sys_image_guid") => guid_text(d.info.node_guid),
            _ => return Err(Errno(libc::ENOENT)),
        };
        let bytes = text.as_bytes();
        let n = bytes.len().min(size - 1);
        // SAFETY: `buf` is non-NULL (checked) with room for `size` bytes, and n + 1 <= size; a
        // Rust String never overlaps the caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
        Ok(n as c_int)
    })
}

fn guid_text(g: u64) -> String {
    format!("{:04x}:{:04x}:{:04x}:{:04x}", g >> 48, (g >> 32) & 0xffff, (g >> 16) & 0xffff, g & 0xffff)
}
