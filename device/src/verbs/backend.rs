//! A context's backends: a daemon's device over its connection, or a device in this process
//! (embedded, or a provider's: the process runs the engine for its own QPs on a socket of the
//! device's steered port). The constructors of [`Context`] and the calls whose work depends on
//! the backend (requests, driving an application-driven device, multicast relays) live here;
//! the object verbs, which only see [`Inner`], stay in the module above.

use super::*;

pub(super) enum Backend {
    Daemon(Connection),
    /// A device in this process (feature `embedded`; the verbs shim leaves it out, so
    /// libibverbs.so does not carry the device, its transport and its capture).
    #[cfg(feature = "embedded")]
    Embedded {
        hca: Arc<Hca>,
        owner: u32,
        event_fd: OwnedFd,
        /// A provider's link to the daemon of the device whose port it shares
        /// ([`Context::provider`]): kept open for the context's life, so that the daemon takes
        /// its member and QPN blocks back when this process goes; the provider's reports
        /// (counters, captured packets) travel on it too.
        daemon: Option<Arc<Connection>>,
    },
}

impl Inner {
    /// The device in this process that the application's threads drive (a provider's), if
    /// this is one: its send posts go straight into its engine.
    #[cfg(feature = "embedded")]
    pub(super) fn application_hca(&self) -> Option<&Arc<Hca>> {
        match &self.backend {
            Backend::Embedded { hca, .. } if hca.progress() == crate::hca::Progress::Application => Some(hca),
            _ => None,
        }
    }

    /// Whether the application's threads drive this device ([`crate::hca::Progress::Application`]).
    pub(super) fn application_driven(&self) -> bool {
        match &self.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, .. } => hca.progress() == crate::hca::Progress::Application,
            _ => false,
        }
    }

    /// On a device that the application's threads drive, runs it from this thread now (with
    /// `receive`, reading the socket too) and says so; `false` for every other device.
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    pub(super) fn drive(&self, receive: bool) -> bool {
        match &self.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, .. } if hca.progress() == crate::hca::Progress::Application => {
                hca.drive(receive);
                true
            }
            _ => false,
        }
    }

    /// On a device the application drives: up to `max` completions of CQ `cq` straight from
    /// its engine ([`Hca::poll_cq`]); None for every other device (its completions come
    /// through the CQ's ring). With them, whether another CQ of this context holds completions.
    /// With `drive`, a poll that finds nothing drives the device and looks again.
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    pub(super) fn poll_direct(&self, cq: CqId, max: usize, drive: bool) -> Option<(Vec<WorkCompletion>, bool)> {
        match &self.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, owner, .. } if hca.progress() == crate::hca::Progress::Application => {
                hca.poll_cq(*owner, cq, max, drive)
            }
            _ => None,
        }
    }

    /// On a device the application drives: this thread sleeps on completion channel `fd` and
    /// the device's socket at once, for at most `wait` ([`Hca::sleep_on_channel`]); None for
    /// every other device (the caller waits on the channel alone).
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    pub(super) fn sleep_on_channel(&self, fd: BorrowedFd<'_>, wait: Option<Duration>) -> Option<nix::Result<()>> {
        match &self.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, .. } => hca.sleep_on_channel(fd, self.hangup_fd(), wait),
            _ => None,
        }
    }

    /// On a device the application drives: this thread stops polling for now (see
    /// `Hca::end_handoff`); nothing for every other device.
    pub(super) fn end_handoff(&self) {
        #[cfg(feature = "embedded")]
        if let Backend::Embedded { hca, .. } = &self.backend {
            hca.end_handoff();
        }
    }

    /// After a poll that returned completions: as [`Inner::end_handoff`], or when an answer is
    /// `likely`, after this thread's next send has left (see `Hca::end_handoff_after_poll`).
    #[cfg_attr(not(feature = "embedded"), allow(unused_variables))]
    pub(super) fn end_handoff_after_poll(&self, likely: bool, received: bool) {
        #[cfg(feature = "embedded")]
        if let Backend::Embedded { hca, .. } = &self.backend {
            hca.end_handoff_after_poll(likely, received);
        }
    }

    pub(super) fn call_fds(&self, req: Request, fd: Option<RawFd>) -> Result<(Response, Vec<OwnedFd>)> {
        let (resp, fds) = match &self.backend {
            Backend::Daemon(c) => c.call(&req, fd.as_slice())?,
            #[cfg(feature = "embedded")]
            Backend::Embedded { hca, owner, daemon, .. } => {
                // A provider whose daemon went: its device is gone for the program, which has
                // heard IBV_EVENT_DEVICE_FATAL; every call fails from then on, as uverbs' do
                // after a device removal (its QPs' own data path runs in this process and is
                // left as it is).
                // Destroying an object still frees it in this process's engine.
                let destroy = matches!(
                    req,
                    Request::DeallocPd(_)
                        | Request::DeregMr(_)
                        | Request::DeallocMw(_)
                        | Request::DestroyCompChannel(_)
                        | Request::DestroyCq(_)
                        | Request::DestroyQp(_)
                        | Request::DestroySrq(_)
                        | Request::CloseXrcd(_)
                        | Request::DestroyQpHandle { .. }
                );
                if !destroy && self.hangup.as_ref().is_some_and(|h| h.gone.load(Ordering::SeqCst)) {
                    return Err(Error::Device(ClientError::Lost(crate::proto::ProtoError::Closed)));
                }
                let fds = match fd {
                    // SAFETY: the caller lends a descriptor it keeps open for the call.
                    Some(f) => vec![unsafe { BorrowedFd::borrow_raw(f) }
                        .try_clone_to_owned()
                        .map_err(|_| VerbsError::NoMem)?],
                    None => Vec::new(),
                };
                let again = matches!(req, Request::RegMr { .. } | Request::AllocMw { .. }).then(|| req.clone());
                let (mut r, mut out) = hca.call(*owner, req, fds);
                // A provider's key blocks are full (engine/src/device/keys.rs): one more from its
                // daemon, then once again; the daemon's ENOMEM is the program's.
                if let (Some(again), Response::Err(VerbsError::NoMem), Some(d)) = (again, &r, daemon) {
                    if let Ok((Response::KeyBlock(b), _)) = d.call(&Request::KeyBlock, &[]) {
                        hca.add_key_block(b);
                        (r, out) = hca.call(*owner, again, Vec::new());
                    }
                }
                let out = out.iter().filter_map(|e| e.as_fd().try_clone_to_owned().ok()).collect();
                (r, out)
            }
        };
        match resp {
            Response::Err(e) => Err(Error::Verbs(e)),
            r => Ok((r, fds)),
        }
    }

    /// The device connection, to notice the device going away while waiting (daemons only).
    pub(super) fn hangup_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backend {
            Backend::Daemon(c) => Some(c.hangup_fd()),
            #[cfg(feature = "embedded")]
            Backend::Embedded { daemon: Some(c), .. } => Some(c.hangup_fd()),
            #[cfg(feature = "embedded")]
            Backend::Embedded { .. } => None,
        }
    }

    pub(super) fn call(&self, req: Request) -> Result<Response> {
        Ok(self.call_fds(req, None)?.0)
    }

    /// A provider's QP attached to or detached from `group`: tells the daemon, which passes the
    /// group's datagrams on (nothing to tell for other contexts).
    /// QP `qpn` attached to `group` (`on`) or detached from it, in the engine: tells a
    /// provider's daemon when the process's first QP attaches to the group or its last leaves.
    pub(super) fn mcast_attached(&self, qpn: Qpn, group: IpAddr, on: bool) -> Result<()> {
        let mut set = self.mcast.lock().unwrap_or_else(|e| e.into_inner());
        let others = |set: &std::collections::BTreeSet<(IpAddr, Qpn)>| set.iter().any(|&(g, q)| g == group && q != qpn);
        if on {
            if set.contains(&(group, qpn)) {
                return Ok(());
            }
            if !others(&set) {
                self.mcast_relay(group, true)?;
            }
            set.insert((group, qpn));
        } else if set.remove(&(group, qpn)) && !others(&set) {
            self.mcast_relay(group, false)?;
        }
        Ok(())
    }

    /// QP `qpn` is destroyed: it leaves every group it was attached to.
    pub(super) fn mcast_forget(&self, qpn: Qpn) {
        let groups: Vec<IpAddr> = {
            let set = self.mcast.lock().unwrap_or_else(|e| e.into_inner());
            set.iter().filter(|&&(_, q)| q == qpn).map(|&(g, _)| g).collect()
        };
        for g in groups {
            let _ = self.mcast_attached(qpn, g, false);
        }
    }

    pub(super) fn mcast_relay(&self, group: IpAddr, on: bool) -> Result<()> {
        #[cfg(feature = "embedded")]
        if let Backend::Embedded { daemon: Some(c), .. } = &self.backend {
            return match c.call(&Request::McastRelay { group, on }, &[])?.0 {
                Response::Err(e) => Err(Error::Verbs(e)),
                _ => Ok(()),
            };
        }
        let _ = (group, on);
        Ok(())
    }
}

impl Context {
    /// Opens device `name` (a running daemon, found in the runtime directory).
    pub fn open(name: &str) -> Result<Context> {
        Context::daemon(Connection::connect(name)?)
    }

    /// Opens device `name` in runtime directory `dir`.
    pub fn open_in(dir: &std::path::Path, name: &str) -> Result<Context> {
        Context::daemon(Connection::connect_in(dir, name)?)
    }

    pub(super) fn daemon(mut c: Connection) -> Result<Context> {
        let dup = |f: &OwnedFd| f.try_clone().map_err(|_| Error::Verbs(VerbsError::NoMem));
        let (arena, doorbell) = (dup(&c.arena_fd)?, dup(&c.doorbell)?);
        let (info, release) = (c.info.clone(), c.release);
        c.arena_fd = dup(&c.event_fd)?; // the connection keeps no second arena reference
        let helper = c.helper.clone();
        let inner = Inner::new(Backend::Daemon(c), info, arena, doorbell, release)?;
        if let Some(h) = helper {
            let _ = inner.helper.set(h);
        }
        Ok(Context { inner: Arc::new(inner) })
    }

    /// A context on a device running in this process.
    #[cfg(feature = "embedded")]
    pub fn embedded(hca: &Arc<Hca>) -> Result<Context> {
        let a = hca.attach(std::process::id() as i32).map_err(|_| VerbsError::NoMem)?;
        let event_fd = a.event_fd.as_fd().try_clone_to_owned().map_err(|_| VerbsError::NoMem)?;
        let info = hca.info().clone();
        let backend = Backend::Embedded { hca: hca.clone(), owner: a.owner, event_fd, daemon: None };
        Ok(Context { inner: Arc::new(Inner::new(backend, info, a.arena, a.doorbell, a.release)?) })
    }

    /// Opens device `name` as a user-space provider (`SOFTRDMA_DATAPATH=provider`; the data-path
    /// issue's items 1-3): this process runs the engine for its own QPs on a socket of the
    /// device's steered port that the daemon gives it, with QPNs from a block the port steers
    /// to that socket, and its threads drive it from their post and poll calls
    /// ([`crate::hca::Progress::Application`]); a progress thread serves one-sided targets,
    /// timers and channel sleepers. Its QPs talk to every other QP of the device, the daemon's
    /// and other providers', through the port, and to other devices over the wire.
    ///
    /// The device's settings hold for these QPs: the daemon's fault injection, profile and ICRC
    /// check apply, their counters and (while the device captures) packets are reported to the
    /// daemon (`Request::Publish`, and a capture ring: `Request::CaptureRing`). XRC domains, XRC SRQs and target QPs are the daemon's: the
    /// context makes them on its XRC side (`verbs/xrc.rs`), a second context of this process on the
    /// device's own data path. Errors: the daemon's port is not
    /// steered (`NotSupp`), no QPN block is free (`NoMem`).
    #[cfg(feature = "embedded")]
    pub fn provider(name: &str) -> Result<Context> {
        Context::provider_on(Connection::connect(name)?)
    }

    /// [`Context::provider`] for device `name` in runtime directory `dir`.
    #[cfg(feature = "embedded")]
    pub fn provider_in(dir: &std::path::Path, name: &str) -> Result<Context> {
        Context::provider_on(Connection::connect_in(dir, name)?)
    }

    #[cfg(feature = "embedded")]
    pub(super) fn provider_on(c: Connection) -> Result<Context> {
        let name = c.info.name.clone();
        let (resp, fds) = c.call(&Request::JoinSteering, &[])?;
        let (index, blocks, key_blocks, settings, first_qpn) = match resp {
            Response::Steering { index, blocks, key_blocks, settings, first_qpn } => {
                (index, blocks, key_blocks, settings, first_qpn)
            }
            Response::Err(e) => return Err(Error::Verbs(e)),
            _ => return unexpected(),
        };
        // The member socket, then this process's end of its relay link to the daemon.
        let mut fds = fds.into_iter();
        let member = fds.next().ok_or(Error::Verbs(VerbsError::Inval))?;
        let relay_link = fds.next();
        let mut cfg = crate::hca::HcaConfig::new(&c.info.name, c.info.addr);
        cfg.mtu = Some(c.info.active_mtu);
        cfg.progress = crate::hca::Progress::Application;
        // The device's settings hold for this process's QPs as for the daemon's (the data-path
        // issue's item 5): the faults are injected by whoever sends (with draws of its own: the
        // member index goes into the seed), the profile and ICRC check are the device's, and
        // while the device captures, this process reports every packet to it.
        let mut faults: crate::faults::Faults = settings.faults.parse().map_err(|e| {
            tracing::warn!("provider for {name}: the device's faults: {e}");
            Error::Verbs(VerbsError::Inval)
        })?;
        faults.seed ^= u64::from(index + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        cfg.faults = faults;
        cfg.behaviour = settings.behaviour;
        cfg.icrc = settings.icrc;
        cfg.max_cqe = Some(settings.max_cqe);
        // While the device captures, this process's frames go into a capture ring of its own,
        // which the daemon drains into the device's file.
        if settings.capture {
            let ring = crate::capture::Ring::create(crate::capture::ring_bytes()).map_err(|e| {
                tracing::warn!("provider for {name}: capture ring: {e}");
                Error::Verbs(VerbsError::NoMem)
            })?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(ring.fd());
            match c.call(&Request::CaptureRing, &[fd])?.0 {
                Response::Ok => cfg.capture_ring = Some(Arc::new(ring)),
                Response::Err(e) => return Err(Error::Verbs(e)),
                _ => return unexpected(),
            }
        }
        cfg.key_blocks = key_blocks;
        let c = Arc::new(c);
        let link = c.clone();
        let pid = std::process::id();
        cfg.publish = Some(crate::hca::Publisher(Arc::new(move |p| {
            // A forked child (which should not use its parent's verbs objects anyway) never
            // speaks on its parent's connection: the frames would interleave.
            if std::process::id() == pid {
                let _ = link.call(&Request::Publish(Box::new(p)), &[]);
            }
        })));
        // Batched sends as the daemon makes them (docs/architecture.md D5; one destination QP per
        // batch).
        cfg.gso = true;
        let hca = Arc::new(Hca::start_member(cfg, member, relay_link, blocks, first_qpn).map_err(|e| {
            tracing::warn!("provider for {name}: {e}");
            Error::Verbs(VerbsError::NoMem)
        })?);
        let a = hca.attach(std::process::id() as i32).map_err(|_| VerbsError::NoMem)?;
        let event_fd = a.event_fd.as_fd().try_clone_to_owned().map_err(|_| VerbsError::NoMem)?;
        let info = hca.info().clone();
        let dir = c.dir.clone();
        let backend = Backend::Embedded { hca, owner: a.owner, event_fd, daemon: Some(c) };
        let mut inner = Inner::new(backend, info, a.arena, a.doorbell, a.release)?;
        inner.daemon_at = Some((dir, name));
        Ok(Context { inner: Arc::new(inner) })
    }

    /// A context on a device in this process whose memory the device reaches only through a
    /// helper thread of this context (the fallback for processes the kernel guards against
    /// cross-process access; here to exercise it).
    #[cfg(feature = "embedded")]
    pub fn embedded_with_memory_helper(hca: &Arc<Hca>) -> Result<Context> {
        let (ctx, theirs) = Context::embedded_with_helper_socket(hca, crate::memory::HELPER_TIMEOUT)?;
        let progress = Arc::new(crate::memory::HelperProgress::default());
        let _ = ctx.inner.helper.set(progress.clone());
        std::thread::Builder::new()
            .name("softrdma-memory".into())
            .spawn(move || {
                crate::signals::keep_off_this_thread();
                crate::memory::serve_helper(theirs, progress)
            })
            .map_err(|_| VerbsError::NoMem)?;
        Ok(ctx)
    }

    /// A context on a device in this process that reaches its memory only through a helper
    /// on the socket returned, which the caller serves (or, to test a client whose helper
    /// stops answering, does not), each answer awaited at most `timeout`.
    #[cfg(feature = "embedded")]
    pub fn embedded_with_helper_socket(
        hca: &Arc<Hca>,
        timeout: std::time::Duration,
    ) -> Result<(Context, std::os::unix::net::UnixStream)> {
        let ctx = Context::embedded(hca)?;
        let Backend::Embedded { owner, .. } = &ctx.inner.backend else { return unexpected() };
        let (mine, theirs) = std::os::unix::net::UnixStream::pair().map_err(|_| VerbsError::NoMem)?;
        hca.use_memory_helper_timeout(*owner, mine, timeout);
        Ok((ctx, theirs))
    }

    /// Whether this process runs this context's QPs itself ([`Context::provider`]).
    pub fn is_provider(&self) -> bool {
        match &self.inner.backend {
            #[cfg(feature = "embedded")]
            Backend::Embedded { daemon, .. } => daemon.is_some(),
            _ => false,
        }
    }
}
