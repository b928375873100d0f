//! A case's variables (the DUT's QPN, its PSNs, its MRs' addresses and keys, fields saved from
//! packets) and the expressions over them that cases write: `sq`, `rq+2`, `mr0.addr+64`, `0x10`.

use std::collections::BTreeMap;

use super::case::Num;

#[derive(Debug, Clone, Default)]
pub(crate) struct Vars(BTreeMap<String, u64>);

impl Vars {
    pub(crate) fn set(&mut self, k: &str, v: u64) {
        self.0.insert(k.to_string(), v);
    }

    pub(crate) fn get(&self, k: &str) -> Result<u32, String> {
        self.get64(k).map(|v| v as u32)
    }

    pub(crate) fn get64(&self, k: &str) -> Result<u64, String> {
        self.0.get(k).copied().ok_or(format!("no variable {k:?} (known: {})", self.names()))
    }

    fn names(&self) -> String {
        self.0.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// `term (('+'|'-') term)*`, a term a number (decimal or 0x) or a variable; wrapping u64.
    pub(crate) fn expr(&self, s: &str) -> Result<u64, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("an empty expression".into());
        }
        let mut total = 0u64;
        let mut sign = 1i8;
        let mut term = String::new();
        let flush = |term: &mut String, sign: i8, total: &mut u64| -> Result<(), String> {
            let t = term.trim();
            if t.is_empty() {
                return Err(format!("expression {s:?}: a missing term"));
            }
            let x = match t.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).map_err(|_| format!("expression {s:?}: {t:?}"))?,
                None if t.starts_with(|c: char| c.is_ascii_digit()) => {
                    t.parse().map_err(|_| format!("expression {s:?}: {t:?}"))?
                }
                None => self.get64(t)?,
            };
            *total = if sign > 0 { total.wrapping_add(x) } else { total.wrapping_sub(x) };
            term.clear();
            Ok(())
        };
        for c in s.chars() {
            match c {
                '+' | '-' => {
                    flush(&mut term, sign, &mut total)?;
                    sign = if c == '+' { 1 } else { -1 };
                }
                c => term.push(c),
            }
        }
        flush(&mut term, sign, &mut total)?;
        Ok(total)
    }

    pub(crate) fn eval(&self, n: &Num) -> Result<u64, String> {
        match n {
            Num::Int(i) => Ok(*i as u64),
            Num::Expr(s) => self.expr(s),
        }
    }

    /// Replaces each `${expr}` in an agent command with its value in hex.
    pub(crate) fn substitute(&self, cmd: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = cmd;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let tail = &rest[i + 2..];
            let j = tail.find('}').ok_or(format!("agent command {cmd:?}: an unclosed ${{"))?;
            out.push_str(&format!("{:#x}", self.expr(&tail[..j])?));
            rest = &tail[j + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_add_subtract_and_name_what_is_unknown() {
        let mut v = Vars::default();
        v.set("sq", 0x100);
        v.set("mr0.addr", 0x7000_0000);
        assert_eq!(v.expr("sq+1").unwrap(), 0x101);
        assert_eq!(v.expr("mr0.addr + 0x40 - 4").unwrap(), 0x7000_003c);
        assert_eq!(v.expr("0").unwrap(), 0);
        assert_eq!(v.expr("sq-0x101").unwrap(), u64::MAX);
        assert!(v.expr("rq").unwrap_err().contains("no variable \"rq\""));
        assert!(v.expr("sq+").is_err());
        assert_eq!(v.substitute("post_send raddr=${mr0.addr+8} len=4").unwrap(), "post_send raddr=0x70000008 len=4");
        assert!(v.substitute("x=${sq").is_err());
    }
}
