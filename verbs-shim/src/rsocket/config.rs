//! The defaults rsockets start from: rdma-core's, overridden by the files rdma-core's rsocket.c
//! reads from its configuration directory (`/etc/rdma/rsocket`; `SOFTRDMA_RSOCKET_CONF_DIR`
//! names another, for tests and for users without root): `polling_time` (us),
//! `wake_up_interval` (ms), `inline_default`, `sqsize_default`, `rqsize_default`, `mem_default`,
//! `wmem_default`, `iomap_size`. Each holds one decimal number; a missing or unreadable file
//! leaves rdma-core's default.

use std::sync::OnceLock;

/// The smallest send buffer and the size of a send that rsend waits for room for.
pub(super) const SNDLOWAT: u32 = 2048;

pub(super) struct Defaults {
    pub(super) polling_time_us: u32,
    pub(super) wake_up_interval_ms: i32,
    pub(super) inline: u16,
    pub(super) sqsize: u16,
    pub(super) rqsize: u16,
    pub(super) mem: u32,
    pub(super) wmem: u32,
    pub(super) iomap_size: u16,
}

fn read_num(dir: &str, name: &str) -> Option<i64> {
    let s = std::fs::read_to_string(format!("{dir}/{name}")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

pub(super) fn defaults() -> &'static Defaults {
    static D: OnceLock<Defaults> = OnceLock::new();
    D.get_or_init(|| load(&std::env::var("SOFTRDMA_RSOCKET_CONF_DIR").unwrap_or_else(|_| "/etc/rdma/rsocket".into())))
}

/// rdma-core's defaults with the files of `dir` applied.
pub(super) fn load(dir: &str) -> Defaults {
    let mut d = Defaults {
        polling_time_us: 10,
        wake_up_interval_ms: 500,
        inline: 64,
        sqsize: 384,
        rqsize: 384,
        mem: 1 << 17,
        wmem: 1 << 17,
        iomap_size: 0,
    };
    let num = |name: &str, lo: i64, hi: i64| read_num(dir, name).map(|v| v.clamp(lo, hi));
    let u16max = u16::MAX as i64;
    if let Some(v) = num("polling_time", 0, u32::MAX as i64) {
        d.polling_time_us = v as u32;
    }
    if let Some(v) = num("wake_up_interval", 1, i32::MAX as i64) {
        d.wake_up_interval_ms = v as i32;
    }
    for (name, field) in
        [("inline_default", &mut d.inline), ("sqsize_default", &mut d.sqsize), ("rqsize_default", &mut d.rqsize)]
    {
        if let Some(v) = num(name, 0, u16max) {
            *field = v as u16;
        }
    }
    if let Some(v) = num("mem_default", 1, u32::MAX as i64) {
        d.mem = v as u32;
    }
    if let Some(v) = num("wmem_default", 0, u32::MAX as i64) {
        d.wmem = if (v as u32) < SNDLOWAT { SNDLOWAT << 1 } else { v as u32 };
    }
    if let Some(v) = num("iomap_size", 0, u16max) {
        // Rounded to a size the connection data can carry.
        d.iomap_size = round_iomap(v as u32);
    }
    d
}

/// The connection data's 8-bit encoding of an iomap size (rdma-core's rs_value_to_scale with 8
/// bits): values up to 128 as they are, larger ones as 0x80 | value >> 8.
pub(super) fn value_to_scale(v: u32) -> u8 {
    if v <= 1 << 7 {
        v as u8
    } else {
        ((1 << 7) | (v >> 8)).min(0xFF) as u8
    }
}

/// The inverse of [`value_to_scale`].
pub(super) fn scale_to_value(s: u8) -> u32 {
    let s = s as u32;
    if s <= 1 << 7 {
        s
    } else {
        (s & !(1 << 7)) << 8
    }
}

/// An iomap size as the peer will see it.
pub(super) fn round_iomap(v: u32) -> u16 {
    scale_to_value(value_to_scale(v)).min(u16::MAX as u32) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_files_override_the_defaults() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let put = |n: &str, v: &str| std::fs::write(dir.path().join(n), v).expect("write");
        put("sqsize_default", "64\n");
        put("inline_default", "0");
        put("wmem_default", "100");
        put("polling_time", "not a number");
        put("iomap_size", "1030");
        let d = load(dir.path().to_str().expect("path"));
        assert_eq!(d.sqsize, 64);
        assert_eq!(d.inline, 0);
        assert_eq!(d.rqsize, 384, "no file: rdma-core's default");
        assert_eq!(d.wmem, SNDLOWAT << 1, "below the low-water mark: twice it, as rdma-core");
        assert_eq!(d.polling_time_us, 10, "unreadable: the default");
        assert_eq!(d.iomap_size, 1024, "rounded to what the connection data carries");
    }

    #[test]
    fn iomap_sizes_round_as_the_connection_data_carries_them() {
        assert_eq!(round_iomap(0), 0);
        assert_eq!(round_iomap(100), 100);
        assert_eq!(round_iomap(128), 128);
        assert_eq!(round_iomap(1024), 1024);
        assert_eq!(round_iomap(1030), 1024);
        assert_eq!(value_to_scale(1024), 0x84);
        assert_eq!(scale_to_value(0x84), 1024);
    }
}
