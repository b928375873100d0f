//! `softrdma doctor [--addr A] [--json]`: checks what softrdma needs of this machine and says
//! how to fix each problem. One line per check (`ok`, `warn`: works, with a cost or a limit;
//! `FAIL`: something softrdma needs is missing); exit 1 when any check failed.
//!
//! - the runtime directory (created 0700 if missing; refused when others can enter it);
//! - UDP port 4791 free on the device address (and, when taken, by whom: a softrdma device, or the
//!   kernel's rdma_rxe, which binds 4791 on every address);
//! - multicast through the loopback interface (a datagram to a group, joined on the address's
//!   interface, heard back: rdma_cm multicast between devices of one host);
//! - the namespaces `exec` presents devices in (a mount namespace; for other users than root, a
//!   user namespace too);
//! - Yama's ptrace_scope (the device reaches clients' memory with process_vm_readv/writev; 2 and
//!   3 forbid it, and clients fall back to a slower memory helper);
//! - the memlock limit (informational: softrdma pins nothing);
//! - UDP GSO and GRO (the device batches with them when the kernel has them).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

#[derive(clap::Args)]
pub(crate) struct DoctorArgs {
    /// The address a device would use (its UDP 4791 is checked).
    #[arg(long, default_value = "127.0.0.1")]
    addr: Ipv4Addr,
    /// The UDP port a device would use.
    #[arg(long, default_value_t = 4791)]
    port: u16,
    /// One JSON object: {"checks": [{"name", "status", "detail", "fix"}], "failed": N}.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Serialize)]
struct Check {
    name: &'static str,
    status: Status,
    detail: String,
    /// How to fix it (empty when nothing needs fixing).
    fix: String,
}

fn ok(name: &'static str, detail: impl Into<String>) -> Check {
    Check { name, status: Status::Ok, detail: detail.into(), fix: String::new() }
}
fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { name, status: Status::Warn, detail: detail.into(), fix: fix.into() }
}
fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { name, status: Status::Fail, detail: detail.into(), fix: fix.into() }
}

pub(crate) fn run(a: &DoctorArgs) -> Result<ExitCode> {
    // Forks (the namespace probe) happen here, before any thread starts.
    let checks = vec![
        runtime_dir(),
        udp_port(a.addr, a.port),
        multicast(a.addr),
        namespaces(),
        ptrace_scope(),
        memlock(),
        gso_gro(a.addr),
    ];
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if a.json {
        println!("{}", serde_json::json!({ "checks": checks, "failed": failed }));
    } else {
        for c in &checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{tag}  {:<16} {}", c.name, c.detail);
            if !c.fix.is_empty() {
                println!("      {:<16} fix: {}", "", c.fix);
            }
        }
        println!("{} checks, {failed} failed", checks.len());
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn runtime_dir() -> Check {
    const N: &str = "runtime dir";
    let path = softrdma_device::runtime::runtime_dir_path();
    match softrdma_device::runtime::runtime_dir() {
        Ok(p) => ok(N, format!("{} (mode 0700, yours)", p.display())),
        Err(e) => fail(
            N,
            format!("{e}"),
            format!(
                "chmod 700 {p} if it is yours, else remove it, or point SOFTRDMA_RUNTIME_DIR at a directory of your own",
                p = path.display()
            ),
        ),
    }
}

fn udp_port(addr: Ipv4Addr, port: u16) -> Check {
    const N: &str = "udp port";
    let at = SocketAddr::from((addr, port));
    match UdpSocket::bind(at) {
        Ok(_) => ok(N, format!("UDP {at} is free for a device")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            // Who holds it: one of our devices, or the kernel's soft-RoCE.
            let dir = softrdma_device::runtime::runtime_dir_path();
            let ours = softrdma_device::runtime::list_devices(&dir).into_iter().find(|name| {
                softrdma_device::client::Connection::connect_in(&dir, name)
                    .is_ok_and(|c| c.info.addr == std::net::IpAddr::V4(addr))
            });
            let rxe = std::path::Path::new("/sys/module/rdma_rxe").exists();
            match (ours, rxe) {
                (Some(name), _) => warn(
                    N,
                    format!("UDP {at} is taken by softrdma device {name} (it is up)"),
                    format!("nothing, to use {name}; for another device pick another --addr"),
                ),
                (None, true) => fail(
                    N,
                    format!("UDP {at} is taken; the kernel's rdma_rxe is loaded and binds UDP {port} on every address"),
                    "rdma link delete the rxe link (or rmmod rdma_rxe), or give softrdma another --port (peers must use it too)",
                ),
                (None, false) => fail(
                    N,
                    format!("UDP {at} is taken by another program"),
                    format!("find it with `ss -ulpn 'sport = :{port}'` and stop it, or use another --addr"),
                ),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => fail(
            N,
            format!("{addr} is not an address of this machine"),
            format!("ip addr add {addr}/32 dev lo, or use another --addr"),
        ),
        Err(e) => fail(N, format!("binding UDP {at}: {e}"), "see the error"),
    }
}

/// A datagram to a group joined on `addr`'s interface, sent out of that interface, heard back.
fn multicast(addr: Ipv4Addr) -> Check {
    const N: &str = "multicast";
    let probe = || -> std::io::Result<bool> {
        let seed = std::process::id();
        let group = Ipv4Addr::new(239, 255, (seed >> 8) as u8, seed as u8 | 1);
        let rx = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
        rx.set_reuse_address(true)?;
        rx.bind(&SocketAddr::from((group, 0)).into())?;
        rx.join_multicast_v4(&group, &addr)?;
        rx.set_read_timeout(Some(Duration::from_secs(1)))?;
        let port = rx.local_addr()?.as_socket().map(|s| s.port()).unwrap_or(0);
        let tx = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
        tx.set_multicast_if_v4(&addr)?;
        tx.set_multicast_loop_v4(true)?;
        tx.send_to(b"softrdma doctor", &SocketAddr::from((group, port)).into())?;
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
        Ok(rx.recv(&mut buf).is_ok_and(|n| n == 15))
    };
    match probe() {
        Ok(true) => ok(N, format!("a datagram to a group joined on {addr} comes back (rdma_cm multicast between devices of this host works)")),
        Ok(false) => fail(
            N,
            format!("a datagram to a group joined on {addr} did not come back within 1 s"),
            "check the firewall for multicast (239.0.0.0/8) on that interface",
        ),
        Err(e) => fail(
            N,
            format!("joining a group on {addr}: {e}"),
            "a device address on an interface with multicast (ip link set dev DEV multicast on)",
        ),
    }
}

/// Whether `exec` can make its private mount namespace (and, not root, the user namespace).
fn namespaces() -> Check {
    const N: &str = "namespaces";
    let root = nix::unistd::geteuid().is_root();
    let flags = if root {
        nix::sched::CloneFlags::CLONE_NEWNS
    } else {
        nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS
    };
    let what = if root { "a mount namespace" } else { "a user and a mount namespace" };
    // SAFETY: `run` calls this before starting any thread, so the child is a full copy that only
    // calls unshare and _exit.
    let r = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let code = if nix::sched::unshare(flags).is_ok() { 0 } else { 1 };
            // SAFETY: _exit ends the forked child without unwinding or running the parent's exit
            // handlers and buffers.
            unsafe { nix::libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => nix::sys::wait::waitpid(child, None).ok(),
        Err(_) => None,
    };
    match r {
        Some(nix::sys::wait::WaitStatus::Exited(_, 0)) => {
            ok(N, format!("{what} can be made: exec presents devices in /dev/infiniband and /sys/class/infiniband"))
        }
        _ => {
            let sysctl = std::fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
                .ok()
                .filter(|v| v.trim() == "1")
                .map(|_| " (AppArmor restricts unprivileged user namespaces: sysctl kernel.apparmor_restrict_unprivileged_userns=0)")
                .or_else(|| {
                    std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone")
                        .ok()
                        .filter(|v| v.trim() == "0")
                        .map(|_| " (sysctl kernel.unprivileged_userns_clone=1)")
                })
                .unwrap_or("");
            warn(
                N,
                format!("the kernel refuses {what}: exec runs programs without the /dev and /sys presentation (verbs programs work; UCX, Open MPI and pyverbs' rdma_cm tests look there)"),
                format!("allow it{sysctl}, or run as root; in a container: --cap-add SYS_ADMIN or a seccomp profile allowing unshare"),
            )
        }
    }
}

fn ptrace_scope() -> Check {
    const N: &str = "ptrace scope";
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").map(|s| s.trim().to_owned()) {
        Err(_) => ok(N, "no Yama: the device reaches clients' memory directly (process_vm_readv/writev)"),
        Ok(v) if v == "0" || v == "1" => ok(
            N,
            format!("Yama ptrace_scope {v}: the device reaches clients' memory directly (clients declare it their tracer)"),
        ),
        Ok(v) => warn(
            N,
            format!("Yama ptrace_scope {v} forbids process_vm_readv/writev: clients serve their memory from a helper thread (slower: a round trip per access)"),
            "sysctl kernel.yama.ptrace_scope=1 (or run the device and the programs with CAP_SYS_PTRACE)",
        ),
    }
}

fn memlock() -> Check {
    const N: &str = "memlock";
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) => {
            let v = if soft == nix::sys::resource::RLIM_INFINITY {
                "unlimited".into()
            } else {
                format!("{} KiB", soft / 1024)
            };
            ok(N, format!("RLIMIT_MEMLOCK {v}: softrdma pins no memory, any limit does (programs that check it themselves may want more: ulimit -l)"))
        }
        Err(e) => warn(N, format!("getrlimit(RLIMIT_MEMLOCK): {e}"), "none needed by softrdma"),
    }
}

fn gso_gro(addr: Ipv4Addr) -> Check {
    use nix::sys::socket::{getsockopt, setsockopt, sockopt};
    const N: &str = "udp gso/gro";
    let Ok(s) = UdpSocket::bind((addr, 0)).or_else(|_| UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))) else {
        return warn(N, "no UDP socket to ask", "none");
    };
    let gso = getsockopt(&s.as_fd(), sockopt::UdpGsoSegment).is_ok();
    let gro = setsockopt(&s.as_fd(), sockopt::UdpGroSegment, &true).is_ok();
    match (gso, gro) {
        (true, true) => ok(N, "UDP GSO and GRO: the device sends and receives segment batches"),
        _ => warn(
            N,
            format!(
                "UDP GSO {}, GRO {}: the device sends and receives one datagram per syscall (slower bulk transfers)",
                if gso { "yes" } else { "no" },
                if gro { "yes" } else { "no" }
            ),
            "a kernel with UDP GSO and GRO (Linux 4.18 and 5.0 on)",
        ),
    }
}
