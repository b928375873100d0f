//! The device presentation of `softrdma exec`: in a private mount namespace, the running
//! softrdma devices appear where the kernel's RDMA stack would put them, so middleware that looks
//! at the file system before it calls verbs finds them.
//!
//! What is made, and who reads it (measured with strace on Debian 12's packages):
//!
//! | path | reader |
//! |---|---|
//! | `/dev/infiniband/uverbsN` (char device) | UCX `uct_ib` (stat + access R/W of `/dev/infiniband/<ibv_device.dev_name>`; a device without it is skipped silently) |
//! | `/dev/infiniband/rdma_cm` (char device) | rdma-core's librdmacm (opens it; the shim's does not), UCX `uct_rdmacm` |
//! | `/sys/class/infiniband/<dev>/node_type`, `node_guid`, `sys_image_guid`, `fw_ver`, `node_desc` | `ibv_devinfo`-like tools, pyverbs, Open MPI's openib (checks `/sys/class/infiniband` exists) |
//! | `.../device/net/<ifname>` | pyverbs' rdma_cm tests (the device's IP is that interface's first address), libfabric |
//! | `.../device/numa_node` | UCX (device distance), NCCL |
//! | `.../ports/1/{state,phys_state,link_layer,rate,lid,sm_lid,lid_mask_count,sm_sl,cap_mask}` | UCX, NCCL, `ibstat`-like tools |
//! | `.../ports/1/gids/N`, `gid_attrs/types/N`, `gid_attrs/ndevs/N` | UCX (RoCE version of a GID: without `types` it assumes RoCE v1), NCCL, rdma-core's `show_gids` |
//! | `.../ports/1/pkeys/0` | NCCL, Open MPI |
//! | `/sys/class/infiniband_verbs/abi_version`, `uverbsN/{ibdev,abi_version,dev}` | rdma-core's libibverbs device discovery (the shim's does not need it), UCX |
//!
//! The values are the ones the shim reports through verbs (ibv_query_device/port/gid), written
//! in the kernel's sysfs formats (drivers/infiniband/core/sysfs.c). The character devices are
//! bind mounts of `/dev/null`: a real uverbs node could not be opened without the kernel module
//! anyway (nothing here opens it: the shim replaces libibverbs), and an unprivileged user
//! namespace cannot make device nodes at all.
//!
//! How: as root, a new mount namespace; as another user, a user namespace that maps only the
//! user's own uid and gid (so the program runs as itself, not as uid 0) plus a mount namespace.
//! sysfs cannot make directories and `/sys/class/infiniband` does not exist without the kernel's
//! RDMA core, so `/sys/class` becomes a tmpfs that holds bind mounts of every real class (net/
//! and the rest) beside the generated `infiniband` and `infiniband_verbs`; `/dev` likewise
//! becomes a tmpfs holding every real entry (bind mounts: null, zero, urandom, shm, pts, ...)
//! beside the generated `infiniband/`. Nothing outside the namespace changes.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use softrdma_device::client::Connection;
use softrdma_device::proto::DeviceInfo;

/// A device as it will be presented: its uverbs index is its place in name order, the order in
/// which the shim's `ibv_get_device_list` numbers `ibv_device.dev_name` in a new process.
pub(crate) struct Presented {
    pub(crate) index: usize,
    pub(crate) info: DeviceInfo,
    /// The network interface that holds the device's address (`lo` for 127.0.0.0/8).
    pub(crate) ifname: Option<String>,
}

/// The devices running in `dir`, with their interfaces.
pub(crate) fn devices(dir: &Path) -> Vec<Presented> {
    let names = softrdma_device::runtime::list_devices(dir);
    let mut out = Vec::new();
    for name in names {
        // The shim leaves out a device it cannot talk to, and so numbers the rest without it.
        let Ok(c) = Connection::connect_in(dir, &name) else { continue };
        let ifname = softrdma_transport::udp::interface_of(c.info.addr);
        out.push(Presented { index: out.len(), info: c.info.clone(), ifname });
    }
    out
}

/// Files (path relative to /sys/class, contents) and symlinks (path, target) of a tree.
type Tree = (Vec<(PathBuf, String)>, Vec<(PathBuf, PathBuf)>);

/// The files of the sysfs tree, as (path relative to /sys/class, contents); symlinks apart.
pub(crate) fn sysfs_files(devs: &[Presented]) -> Tree {
    let mut files = Vec::new();
    let mut links = Vec::new();
    let mut f = |p: String, v: String| files.push((PathBuf::from(p), format!("{v}\n")));
    // drivers/infiniband/core/uverbs_main.c: IB_USER_VERBS_ABI_VERSION.
    f("infiniband_verbs/abi_version".into(), "6".into());
    for d in devs {
        let i = &d.info;
        let n = &i.name;
        let g = i.node_guid;
        let guid = format!("{:04x}:{:04x}:{:04x}:{:04x}", g >> 48, (g >> 32) & 0xffff, (g >> 16) & 0xffff, g & 0xffff);
        let dev = format!("infiniband/{n}");
        f(format!("{dev}/node_type"), "1: CA".into());
        f(format!("{dev}/node_guid"), guid.clone());
        f(format!("{dev}/sys_image_guid"), guid);
        f(format!("{dev}/fw_ver"), env!("CARGO_PKG_VERSION").into());
        f(format!("{dev}/node_desc"), n.clone());
        // A device with no NUMA affinity (virtual devices): the kernel writes -1.
        f(format!("{dev}/device/numa_node"), "-1".into());
        let port = format!("{dev}/ports/1");
        f(format!("{port}/state"), "4: ACTIVE".into());
        f(format!("{port}/phys_state"), "5: LinkUp".into());
        f(format!("{port}/link_layer"), "Ethernet".into());
        // What ibv_query_port says: active_speed 32 (EDR, 25 Gb/s per lane), width 1X.
        f(format!("{port}/rate"), "25 Gb/sec (1X EDR)".into());
        f(format!("{port}/lid"), "0x0".into());
        f(format!("{port}/sm_lid"), "0x0".into());
        f(format!("{port}/lid_mask_count"), "0".into());
        f(format!("{port}/sm_sl"), "0".into());
        // IB_PORT_CM_SUP | IB_PORT_REINIT_SUP | IB_PORT_VENDOR_CLASS_SUP, as ibv_query_port.
        f(format!("{port}/cap_mask"), format!("{:#010x}", (1u32 << 16) | (1 << 18) | (1 << 24)));
        f(format!("{port}/pkeys/0"), "0xffff".into());
        // The shim's GID table has 16 entries, index 0 the RoCEv2 GID of the address; the
        // kernel shows an empty entry as zeros and fails reads of its attributes (no file here).
        for k in 0..16 {
            let gid = if k == 0 { i.gid } else { [0u8; 16] };
            f(format!("{port}/gids/{k}"), gid_string(&gid));
        }
        f(format!("{port}/gid_attrs/types/0"), "RoCE v2".into());
        if let Some(ifname) = &d.ifname {
            f(format!("{port}/gid_attrs/ndevs/0"), ifname.clone());
            links.push((
                PathBuf::from(format!("{dev}/device/net/{ifname}")),
                PathBuf::from(format!("/sys/class/net/{ifname}")),
            ));
        }
        let uv = format!("infiniband_verbs/uverbs{}", d.index);
        f(format!("{uv}/ibdev"), n.clone());
        f(format!("{uv}/abi_version"), "1".into());
        // The uverbs character device numbers (IB_UVERBS_MAJOR 231, minors from 192).
        f(format!("{uv}/dev"), format!("231:{}", 192 + d.index));
        links.push((PathBuf::from(format!("{uv}/device")), PathBuf::from(format!("/sys/class/{dev}/device"))));
    }
    (files, links)
}

/// A GID as the kernel's sysfs shows it (%pI6: eight groups of four hex digits).
fn gid_string(gid: &[u8; 16]) -> String {
    let groups: Vec<String> = gid.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect();
    groups.join(":")
}

/// Enters a private mount namespace (and a user namespace for a user other than root) in which
/// the devices running in `dir` are presented; the caller then execs the program. Fails (and
/// changes nothing visible to others) where the kernel forbids namespaces.
///
/// `fresh_sysfs` mounts a new sysfs on /sys first, for a process that has entered another
/// network namespace (sysfs shows the network devices of the namespace that mounts it).
pub(crate) fn present(dir: &Path, fresh_sysfs: bool) -> Result<usize> {
    enter_namespaces()?;
    let devs = devices(dir);
    // Nothing mounted here propagates back to the host.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("making the mount namespace private")?;
    if fresh_sysfs {
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("sysfs"), "/sys", Some("sysfs"), flags, None::<&str>).context("mounting the namespace's sysfs")?;
    }
    let stage = dir.join(format!(".present-{}", std::process::id()));
    clear_stage(&stage);
    fs::create_dir(&stage).with_context(|| format!("creating {}", stage.display()))?;
    let r = build(&stage, &devs);
    clear_stage(&stage);
    r?;
    Ok(devs.len())
}

/// Detaches whatever is still mounted on the stage and removes its (then empty) directories.
/// Never a recursive removal: a stage that still held its bind mounts would reach into the real
/// /dev/shm and /sys.
fn clear_stage(stage: &Path) {
    for sub in ["sys", "dev"] {
        let p = stage.join(sub);
        let _ = umount2(&p, MntFlags::MNT_DETACH);
        let _ = fs::remove_dir(&p);
    }
    let _ = fs::remove_dir(stage);
}

fn build(stage: &Path, devs: &[Presented]) -> Result<()> {
    // /sys/class: a tmpfs with every real class bound back and our two classes generated.
    let sys = stage.join("sys");
    fs::create_dir(&sys)?;
    tmpfs(&sys, "softrdma-sysfs")?;
    for e in fs::read_dir("/sys/class").context("reading /sys/class")? {
        let e = e?;
        let name = e.file_name();
        if name == "infiniband" || name == "infiniband_verbs" {
            continue; // ours replace the kernel's (the shim shows only softrdma devices)
        }
        let to = sys.join(&name);
        fs::create_dir(&to)?;
        bind(&e.path(), &to, true)?;
    }
    fs::create_dir_all(sys.join("infiniband"))?;
    fs::create_dir_all(sys.join("infiniband_verbs"))?;
    let (files, links) = sysfs_files(devs);
    for (p, v) in files {
        let p = sys.join(p);
        fs::create_dir_all(p.parent().expect("a file in a directory"))?;
        fs::write(&p, v)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o444))?;
    }
    for (p, target) in links {
        let p = sys.join(p);
        fs::create_dir_all(p.parent().expect("a link in a directory"))?;
        symlink(target, &p)?;
    }
    // /dev: a tmpfs with every real entry bound back (or its symlink remade), plus infiniband/.
    let dev = stage.join("dev");
    fs::create_dir(&dev)?;
    tmpfs(&dev, "softrdma-dev")?;
    let mut skipped = Vec::new();
    for e in fs::read_dir("/dev").context("reading /dev")? {
        let e = e?;
        let name = e.file_name();
        if name == "infiniband" {
            continue;
        }
        let to = dev.join(&name);
        let ft = e.file_type()?;
        let r = if ft.is_symlink() {
            fs::read_link(e.path()).and_then(|t| symlink(t, &to)).map_err(anyhow::Error::from)
        } else if ft.is_dir() {
            fs::create_dir(&to).map_err(anyhow::Error::from).and_then(|()| bind(&e.path(), &to, true))
        } else {
            fs::File::create(&to).map_err(anyhow::Error::from).and_then(|_| bind(&e.path(), &to, false))
        };
        if r.is_err() {
            let _ = fs::remove_file(&to).or_else(|_| fs::remove_dir(&to));
            skipped.push(name.to_string_lossy().into_owned());
        }
    }
    for must in ["null", "zero", "urandom"] {
        if skipped.iter().any(|s| s == must) || !dev.join(must).exists() {
            bail!("cannot bring /dev/{must} into the presentation");
        }
    }
    let ib = dev.join("infiniband");
    fs::create_dir(&ib)?;
    fs::set_permissions(&ib, fs::Permissions::from_mode(0o755))?;
    let mut nodes: Vec<String> = devs.iter().map(|d| format!("uverbs{}", d.index)).collect();
    nodes.push("rdma_cm".into());
    for n in nodes {
        let p = ib.join(&n);
        fs::File::create(&p)?;
        bind(Path::new("/dev/null"), &p, false)?;
    }
    fs::set_permissions(&dev, fs::Permissions::from_mode(0o755))?;
    fs::set_permissions(&sys, fs::Permissions::from_mode(0o755))?;
    bind(&sys, Path::new("/sys/class"), true)?;
    bind(&dev, Path::new("/dev"), true)?;
    // (The stage's own mounts go in clear_stage; the trees stay where they were bound. Entries
    // of /dev that could not be bound, if any, are simply absent, as on a minimal /dev.)
    Ok(())
}

fn tmpfs(at: &Path, source: &str) -> Result<()> {
    mount(Some(source), at, Some("tmpfs"), MsFlags::MS_NOSUID, Some("mode=0755"))
        .with_context(|| format!("mounting a tmpfs on {}", at.display()))
}

fn bind(from: &Path, to: &Path, recursive: bool) -> Result<()> {
    let mut flags = MsFlags::MS_BIND;
    if recursive {
        flags |= MsFlags::MS_REC;
    }
    mount(Some(from), to, None::<&str>, flags, None::<&str>)
        .with_context(|| format!("binding {} on {}", from.display(), to.display()))
}

/// A mount namespace; for a user other than root (or a root without CAP_SYS_ADMIN), inside a
/// user namespace that maps exactly the caller's uid and gid onto themselves.
fn enter_namespaces() -> Result<()> {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    if nix::unistd::geteuid().is_root() && unshare(CloneFlags::CLONE_NEWNS).is_ok() {
        return Ok(());
    }
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|e| {
        let hint = match fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone") {
            Ok(v) if v.trim() == "0" => " (kernel.unprivileged_userns_clone is 0)",
            _ => "",
        };
        anyhow::anyhow!("the kernel refuses a user and mount namespace: {e}{hint}")
    })?;
    // setgroups must be denied before an unprivileged process may write its gid_map.
    fs::write("/proc/self/setgroups", "deny").context("writing /proc/self/setgroups")?;
    fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n")).context("writing /proc/self/uid_map")?;
    fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n")).context("writing /proc/self/gid_map")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_print_as_the_kernel_prints_them() {
        let g = softrdma_device::proto::gid_of("127.0.0.5".parse().unwrap());
        assert_eq!(gid_string(&g), "0000:0000:0000:0000:0000:ffff:7f00:0005");
    }
}
