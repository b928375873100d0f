//! `softrdma-bindgen write` regenerates the verbs shim's committed C bindings from the installed
//! rdma-core headers; `softrdma-bindgen check` exits 1 when they differ (scripts/regen-bindings.sh).

use std::process::ExitCode;

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if mode != "write" && mode != "check" {
        eprintln!("usage: softrdma-bindgen write|check");
        return ExitCode::from(2);
    }
    let missing = softrdma_bindgen::missing_inputs();
    if !missing.is_empty() {
        eprintln!("softrdma-bindgen: cannot generate the bindings: missing {}", missing.join(", "));
        return ExitCode::FAILURE;
    }
    let result = if mode == "write" {
        softrdma_bindgen::write_all().map(|paths| {
            for p in paths {
                println!("wrote {}", p.display());
            }
        })
    } else {
        softrdma_bindgen::stale().and_then(|stale| {
            if stale.is_empty() {
                println!("the committed bindings are current");
                Ok(())
            } else {
                Err(format!("the committed bindings differ from the installed headers:\n{}", stale.join("\n")))
            }
        })
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma-bindgen: {e}");
            ExitCode::FAILURE
        }
    }
}
