//! The tester's side of the agent protocol: one command line out, one answer line back
//! (conformance/agent/softrdma-conform-agent.c has the commands).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// An answer: `ok` with its `key=value` fields, or the errno of an `err`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Ok(BTreeMap<String, String>),
    Err { errno: i32, text: String },
}

impl Answer {
    fn parse(line: &str) -> Result<Answer, String> {
        let line = line.trim_end();
        let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
        match head {
            "ok" => {
                let mut m = BTreeMap::new();
                for t in rest.split_whitespace() {
                    match t.split_once('=') {
                        Some((k, v)) => m.insert(k.to_string(), v.to_string()),
                        None => m.insert(t.to_string(), String::new()),
                    };
                }
                Ok(Answer::Ok(m))
            }
            "err" => {
                let (e, text) = rest.split_once(' ').unwrap_or((rest, ""));
                let errno = e
                    .strip_prefix("errno=")
                    .and_then(|v| v.parse().ok())
                    .ok_or(format!("the agent answered {line:?}: an err without errno="))?;
                Ok(Answer::Err { errno, text: text.to_string() })
            }
            _ => Err(format!("the agent answered {line:?}: neither ok nor err")),
        }
    }
}

/// A connection to a `softrdma-conform-agent`.
pub(crate) struct Agent {
    out: TcpStream,
    lines: BufReader<TcpStream>,
}

impl Agent {
    /// Connects to HOST[:PORT] (port 7471 when not given).
    pub(crate) fn connect(dut: &str) -> Result<Agent, String> {
        let with_port = if dut.rsplit_once(':').is_some_and(|(h, p)| !h.ends_with(':') && p.parse::<u16>().is_ok()) {
            dut.to_string()
        } else {
            format!("{dut}:7471")
        };
        let addrs: Vec<_> = with_port.to_socket_addrs().map_err(|e| format!("--dut {dut}: {e}"))?.collect();
        let mut last = String::from("no address");
        // An agent started at the same moment may not listen yet: refused connections are tried
        // again for a few seconds.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        let retried = addrs.iter().cycle().take_while(|_| std::time::Instant::now() < until);
        for (n, a) in addrs.iter().chain(retried).enumerate() {
            if n >= addrs.len() {
                std::thread::sleep(Duration::from_millis(100));
            }
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => {
                    s.set_nodelay(true).ok();
                    // A command the agent never answers (a hung device) ends the case, not the run.
                    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
                    let lines = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
                    return Ok(Agent { out: s, lines });
                }
                Err(e) => last = format!("{a}: {e}"),
            }
        }
        Err(format!(
            "cannot reach the agent at {with_port} ({last}); start softrdma-conform-agent on the device's host"
        ))
    }

    /// Sends one command and reads its answer.
    pub(crate) fn call(&mut self, cmd: &str) -> Result<Answer, String> {
        if cmd.contains('\n') {
            return Err(format!("agent command {cmd:?} holds a newline"));
        }
        writeln!(self.out, "{cmd}").map_err(|e| format!("agent connection: {e}"))?;
        let mut line = String::new();
        match self.lines.read_line(&mut line) {
            Ok(0) => Err(format!("the agent closed the connection after {cmd:?}")),
            Ok(_) => Answer::parse(&line),
            Err(e) => Err(format!("no answer from the agent to {cmd:?}: {e}")),
        }
    }

    /// A command that must succeed; its fields.
    pub(crate) fn ok(&mut self, cmd: &str) -> Result<BTreeMap<String, String>, String> {
        match self.call(cmd)? {
            Answer::Ok(m) => Ok(m),
            Answer::Err { errno, text } => Err(format!("agent `{cmd}` failed: errno {errno} ({text})")),
        }
    }
}

/// A field of an answer as a number (decimal or 0x hex).
pub(crate) fn field(m: &BTreeMap<String, String>, k: &str) -> Result<u64, String> {
    let v = m.get(k).ok_or(format!("the agent's answer has no {k}="))?;
    parse_u64(v).ok_or(format!("the agent's {k}={v} is not a number"))
}

pub(crate) fn parse_u64(v: &str) -> Option<u64> {
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_and_bad_ones_are_errors() {
        let Answer::Ok(m) = Answer::parse("ok id=3 addr=0x1000\n").unwrap() else { panic!() };
        assert_eq!(field(&m, "addr").unwrap(), 0x1000);
        assert_eq!(field(&m, "id").unwrap(), 3);
        assert!(field(&m, "rkey").is_err());
        assert_eq!(
            Answer::parse("err errno=22 Invalid argument").unwrap(),
            Answer::Err { errno: 22, text: "Invalid argument".into() }
        );
        assert!(Answer::parse("err 22").is_err());
        assert!(Answer::parse("hello").is_err());
    }
}
