//! `softrdma --help` lists the commands in groups, the way a user looks for them. clap lists a
//! command's subcommands in one flat "Commands:" section, so the grouped list is rendered here
//! from the command's own subcommands (names and one-line descriptions stay clap's) and put in
//! the help template in place of that section.

use clap::Command;

/// The groups, in the order shown; every visible subcommand is in exactly one (a test checks).
const GROUPS: &[(&str, &[&str])] = &[
    ("Start here", &["demo", "doctor"]),
    ("Devices", &["up", "down", "list", "stat", "cm-ids", "daemon", "cluster"]),
    ("Running programs", &["exec", "shim-path"]),
    ("Capture and replay", &["pcap"]),
    ("Testing", &["sim", "soak", "bench", "conform"]),
];

/// The grouped command list: one heading per group, each command with its one-line description.
fn listing(cmd: &Command) -> String {
    let visible: Vec<&Command> = cmd.get_subcommands().filter(|c| !c.is_hide_set()).collect();
    let width = visible.iter().map(|c| c.get_name().len()).max().unwrap_or(0).max("help".len());
    let mut out = String::new();
    for (heading, names) in GROUPS {
        out.push_str(&format!("{heading}:\n"));
        for name in *names {
            let about = visible
                .iter()
                .find(|c| c.get_name() == *name)
                .and_then(|c| c.get_about())
                .map(|a| a.to_string())
                .unwrap_or_default();
            out.push_str(&format!("  {name:width$}  {about}\n"));
        }
        out.push('\n');
    }
    out.push_str(&format!("  {:width$}  Print this message or the help of the given subcommand(s)\n\n", "help"));
    out
}

/// `cmd` with its subcommands listed in groups in its own `--help`.
pub fn grouped(cmd: Command) -> Command {
    let list = listing(&cmd);
    cmd.help_template(format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{list}Options:\n{{options}}{{after-help}}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_visible_command_is_in_exactly_one_group() {
        let cmd = crate::Cli::command();
        let mut visible: Vec<&str> = cmd.get_subcommands().filter(|c| !c.is_hide_set()).map(|c| c.get_name()).collect();
        visible.sort_unstable();
        let mut grouped: Vec<&str> = GROUPS.iter().flat_map(|(_, names)| names.iter().copied()).collect();
        grouped.sort_unstable();
        assert_eq!(grouped, visible, "help.rs GROUPS and the subcommands of `softrdma` differ");
    }

    #[test]
    fn help_shows_the_groups_with_descriptions() {
        let mut cmd = grouped(crate::Cli::command());
        let help = cmd.render_help().to_string();
        for (heading, _) in GROUPS {
            assert!(help.contains(&format!("{heading}:")), "{help}");
        }
        assert!(help.contains("  demo ") && help.contains("Start two devices"), "{help}");
        assert!(help.contains("Options:") && help.contains("--version"), "{help}");
        assert!(!help.contains("\nCommands:\n"), "the flat list is still there:\n{help}");
    }
}
