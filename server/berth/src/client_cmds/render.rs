//! How the client commands show things: plain text for pipes and files, colour and rendered
//! markdown for a person at a terminal (never when `NO_COLOR` is set), tool calls on one
//! line each, and a failed turn's cause in words.

use std::io::IsTerminal;

use berth_client::protocol::{Cause, Row, RowKind};

/// `text` from the server (the model's words, a tool's output, a title) as it may reach a
/// terminal: every control character but a newline and a tab made visible (ESC as `␛`, the
/// other C0 controls as their control pictures, DEL as `␡`, C1 controls as `�`), and so are
/// the bidirectional overrides and isolates. A model's text could otherwise move the
/// cursor, rewrite or hide what is on screen (a command being approved, say), set the
/// window title or the clipboard, or show a line in another order than it runs.
pub fn safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n' && c != '\t') || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .map(|c| match c {
            c if !unsafe_char(c) => c,
            '\u{7f}' => '\u{2421}',
            c if (c as u32) < 0x20 => char::from_u32(0x2400 + c as u32).unwrap_or('\u{fffd}'),
            _ => '\u{fffd}',
        })
        .collect::<String>()
        .into()
}

/// Colour and markdown on, or plain text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    pub colour: bool,
}

const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";

impl Style {
    /// Colour when standard output is a terminal and `NO_COLOR` is unset (or empty), and
    /// the output is not JSON.
    pub fn for_stdout(json: bool) -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            colour: !json && !no_color && std::io::stdout().is_terminal(),
        }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.colour {
            format!("{code}{text}{RESET}")
        } else {
            text.to_string()
        }
    }

    pub fn bold(self, text: &str) -> String {
        self.paint(BOLD, text)
    }
    pub fn dim(self, text: &str) -> String {
        self.paint(DIM, text)
    }
    pub fn red(self, text: &str) -> String {
        self.paint(RED, text)
    }
    pub fn green(self, text: &str) -> String {
        self.paint(GREEN, text)
    }
    pub fn yellow(self, text: &str) -> String {
        self.paint(YELLOW, text)
    }
    pub fn cyan(self, text: &str) -> String {
        self.paint(CYAN, text)
    }
}

/// A failed (or otherwise ended) turn's cause, in words, with the code for searching.
pub fn cause_words(cause: &Cause) -> String {
    let words = match cause.code.as_str() {
        "provider-unreachable" => {
            "the model endpoint could not be reached: check BERTH_MODEL_BASE_URL and that the endpoint is up"
                .to_string()
        }
        "provider-status" => match cause.status {
            Some(401 | 403) => format!(
                "the model endpoint refused the request (HTTP {}): check BERTH_MODEL_API_KEY",
                cause.status.unwrap_or_default()
            ),
            Some(404) => "the model endpoint answered 404: check BERTH_MODEL and BERTH_MODEL_BASE_URL".to_string(),
            Some(s) => format!("the model endpoint answered with an error (HTTP {s})"),
            None => "the model endpoint answered with an error".to_string(),
        },
        "provider-timeout" => "the model endpoint did not answer in time".to_string(),
        "provider-protocol" | "provider-stream-ended" => {
            "the model endpoint's answer could not be read (is it OpenAI-compatible?)".to_string()
        }
        "provider-rate-limited" => "the model endpoint is rate-limiting requests: try again shortly".to_string(),
        "provider-unconfigured" => {
            "no model is configured on the server: set BERTH_MODEL_BASE_URL and BERTH_MODEL".to_string()
        }
        "provider-response-too-large" => "the model's answer was too large".to_string(),
        "context-overflow" => "the conversation no longer fits the model's context window".to_string(),
        "step-limit" => "the turn used up its model steps (BERTH_WORKER_MAX_STEPS)".to_string(),
        "tool-failed" => "a tool failed".to_string(),
        "worker-lost" => {
            "the worker running the turn went away: is `berth dev` (or `berth worker`) running?".to_string()
        }
        "workspace-offline" => {
            "the workspace's worker is offline: start `berth dev` (or `berth worker`) there".to_string()
        }
        "internal" => "an internal error in Berth (see the server's log)".to_string(),
        other => safe(other).into_owned(),
    };
    if words == cause.code {
        words
    } else {
        format!("{words} ({})", safe(&cause.code))
    }
}

/// What an approval asks about, whole and made [`safe`]: the call's command, path or pattern
/// (else all its input), never cut to a line (a compact line could leave the part that
/// matters past its end); a text of several lines on lines of its own, indented.
pub fn approval_target(name: &str, input: &str) -> String {
    let title = crate::acp::tool_title(name, &crate::acp::tool_input(input));
    let target = match title.strip_prefix(name).and_then(|t| t.strip_prefix(": ")) {
        Some(t) => t.to_string(),
        None => input.to_string(),
    };
    let target = safe(&target);
    if target.contains('\n') {
        let indented: Vec<String> = target.lines().map(|l| format!("    {l}")).collect();
        format!("\n{}\n", indented.join("\n"))
    } else {
        format!(" {target}")
    }
}

/// The first line of `text`, cut to `max` characters, with `…` when anything was left out.
pub fn one_line(text: &str, max: usize) -> String {
    let text = safe(text);
    let first = text.lines().next().unwrap_or("").trim_end();
    let cut: String = first.chars().take(max).collect();
    if cut.len() < first.len() || text.trim_end().contains('\n') {
        format!("{cut}…")
    } else {
        cut
    }
}

/// A tool call on one line: its name and what it acts on (the command, the path, …).
pub fn tool_call_line(style: Style, name: &str, input: &str) -> String {
    let name = &*safe(name);
    let args = crate::acp::tool_title(name, &crate::acp::tool_input(input));
    let target = args.strip_prefix(name).and_then(|t| t.strip_prefix(": "));
    let target = match target {
        Some(t) => one_line(t, 100),
        // No command or path: the arguments, compact.
        None => one_line(input, 100),
    };
    format!("{} {} {target}", style.cyan("⚙"), style.bold(name))
}

/// A tool result on one line: how it ended and the start of its output.
pub fn tool_result_line(style: Style, row: &Row) -> String {
    let status = safe(row.tool.as_ref().map_or("completed", |t| t.status.as_str()));
    let mark = match &*status {
        "completed" => style.green("✓"),
        "denied" => style.yellow("✗ denied"),
        _ => style.red(&format!("✗ {status}")),
    };
    let body = safe(&row.body);
    let lines = body.lines().count();
    let more = if lines > 1 {
        style.dim(&format!(" (+{} lines)", lines - 1))
    } else {
        String::new()
    };
    let first = body.lines().next().unwrap_or("");
    let first: String = first.chars().take(100).collect();
    format!("  {mark} {first}{more}")
}

/// One history row, as `berth history` prints it.
pub fn render_row(style: Style, row: &Row) -> String {
    match row.kind {
        RowKind::User => style.bold(&format!("> {}", safe(&row.body))),
        RowKind::Assistant => {
            let mut md = Markdown::new(style);
            let mut out = md.push(&row.body);
            out.push_str(&md.finish());
            out
        }
        RowKind::ToolCall => tool_call_line(style, row.tool.as_ref().map_or("?", |t| &t.name), &row.body),
        RowKind::ToolResult => tool_result_line(style, row),
        RowKind::Notice => style.dim(&format!("[notice] {}", safe(&row.body))),
        RowKind::Handoff => style.dim(&format!("[summary of earlier history] {}", safe(&row.body))),
    }
}

/// Markdown rendered for a terminal as it streams in: headings and `**bold**` bold,
/// `` `code` `` and fenced blocks in colour, `-`/`*` list items as bullets. Text is shown as
/// soon as it is unambiguous (a line's first characters wait until they tell a fence,
/// heading or bullet from text; a `*` waits for the next character). Without colour the
/// text passes through unchanged.
pub struct Markdown {
    style: Style,
    /// Undecided characters: a line's start, or a lone `*`.
    pending: String,
    at_line_start: bool,
    in_fence: bool,
    in_code: bool,
    in_bold: bool,
    in_heading: bool,
}

impl Markdown {
    pub fn new(style: Style) -> Markdown {
        Markdown {
            style,
            pending: String::new(),
            at_line_start: true,
            in_fence: false,
            in_code: false,
            in_bold: false,
            in_heading: false,
        }
    }

    /// Render the next piece of text; what comes back can be printed at once.
    pub fn push(&mut self, text: &str) -> String {
        let text = safe(text);
        if !self.style.colour {
            return text.into_owned();
        }
        let mut out = String::new();
        for c in text.chars() {
            self.pending.push(c);
            self.drain(&mut out, false);
        }
        out
    }

    /// The end of the text: whatever waited, and the styles closed.
    pub fn finish(&mut self) -> String {
        if !self.style.colour {
            return String::new();
        }
        let mut out = String::new();
        self.drain(&mut out, true);
        if self.in_code || self.in_bold || self.in_heading || self.in_fence {
            out.push_str(RESET);
        }
        *self = Markdown::new(self.style);
        out
    }

    fn drain(&mut self, out: &mut String, end: bool) {
        loop {
            if self.pending.is_empty() {
                return;
            }
            if self.at_line_start {
                if !self.line_start(out, end) {
                    return;
                }
                continue;
            }
            let c = self.pending.chars().next().unwrap_or_default();
            if c == '\n' {
                self.pending.remove(0);
                if self.in_heading || self.in_bold || self.in_code {
                    out.push_str(RESET);
                    if self.in_fence {
                        out.push_str(CYAN);
                    }
                }
                self.in_heading = false;
                self.in_bold = false;
                self.in_code = false;
                out.push('\n');
                self.at_line_start = true;
                continue;
            }
            if self.in_fence {
                out.push(c);
                self.pending.remove(0);
                continue;
            }
            match c {
                '`' => {
                    self.pending.remove(0);
                    self.in_code = !self.in_code;
                    out.push_str(if self.in_code { CYAN } else { RESET });
                    self.restore(out);
                }
                '*' if !self.in_code => {
                    if self.pending.len() < 2 && !end {
                        return;
                    }
                    if self.pending.starts_with("**") {
                        self.pending.drain(..2);
                        self.in_bold = !self.in_bold;
                        out.push_str(if self.in_bold { BOLD } else { RESET });
                        self.restore(out);
                    } else {
                        self.pending.remove(0);
                        out.push('*');
                    }
                }
                _ => {
                    self.pending.remove(0);
                    out.push(c);
                }
            }
        }
    }

    /// After a reset: the styles still open.
    fn restore(&self, out: &mut String) {
        if self.in_heading || self.in_bold {
            out.push_str(BOLD);
        }
        if self.in_code {
            out.push_str(CYAN);
        }
    }

    /// Decide what a line starts with; false when more text is needed.
    fn line_start(&mut self, out: &mut String, end: bool) -> bool {
        let p = self.pending.as_str();
        let complete = end || p.contains('\n');
        let trimmed = p.trim_start_matches(' ');
        let indent = p.len() - trimmed.len();
        if trimmed.starts_with("```") {
            if !complete {
                return false;
            }
            // The fence line itself is shown dim; the block between in colour.
            let line_end = p.find('\n').map_or(p.len(), |i| i + 1);
            let line: String = self.pending.drain(..line_end).collect();
            self.in_fence = !self.in_fence;
            out.push_str(RESET);
            out.push_str(DIM);
            out.push_str(line.trim_end_matches('\n'));
            out.push_str(RESET);
            if self.in_fence {
                out.push_str(CYAN);
            }
            if line.ends_with('\n') {
                out.push('\n');
            }
            self.at_line_start = true;
            return true;
        }
        if self.in_fence {
            // Could still become the closing fence.
            if !complete && "```".starts_with(trimmed) {
                return false;
            }
            self.at_line_start = false;
            return true;
        }
        let undecided = trimmed.is_empty()
            || "```".starts_with(trimmed)
            || trimmed.chars().all(|c| c == '#')
            || matches!(trimmed, "-" | "*" | "+");
        if !complete && undecided {
            return false;
        }
        if let Some(rest) = ["- ", "* ", "+ "].iter().find_map(|b| trimmed.strip_prefix(b)) {
            let rest = rest.to_string();
            out.push_str(&" ".repeat(indent));
            out.push_str("• ");
            self.pending = rest;
            self.at_line_start = false;
            return true;
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
            self.in_heading = true;
            out.push_str(BOLD);
            self.pending = trimmed[hashes + 1..].to_string();
            self.at_line_start = false;
            return true;
        }
        self.at_line_start = false;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(pieces: &[&str]) -> String {
        let mut md = Markdown::new(Style { colour: true });
        let mut out: String = pieces.iter().map(|p| md.push(p)).collect();
        out.push_str(&md.finish());
        out
    }

    #[test]
    fn markdown_renders_the_same_however_the_text_is_cut() {
        let text = "# Title\nSome **bold** and `code`.\n- one\n- two\n```rust\nlet x = 1 * 2;\n```\ndone *really*";
        let whole = render(&[text]);
        let by_char: Vec<String> = text.chars().map(String::from).collect();
        let by_char: Vec<&str> = by_char.iter().map(String::as_str).collect();
        assert_eq!(render(&by_char), whole);
        assert!(whole.contains(&format!("{BOLD}Title")), "{whole:?}");
        assert!(whole.contains(&format!("{BOLD}bold{RESET}")), "{whole:?}");
        assert!(whole.contains(&format!("{CYAN}code{RESET}")), "{whole:?}");
        assert!(whole.contains("• one\n• two\n"), "{whole:?}");
        assert!(whole.contains("let x = 1 * 2;"), "{whole:?}");
        assert!(whole.contains("done *really*"), "{whole:?}");
        assert!(!whole.contains("**"), "{whole:?}");
    }

    #[test]
    fn control_characters_from_the_server_are_shown_not_obeyed() {
        let evil = "ls\x1b[2K\r\x1b]52;c;ZXZpbA==\x07 \u{202E}txt.exe\u{9b}31m\x7f";
        let shown = safe(evil);
        assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
        assert_eq!(shown, "ls␛[2K␍␛]52;c;ZXZpbA==␇ �txt.exe�31m␡");
        assert_eq!(safe("plain\n\ttext"), "plain\n\ttext");
        for style in [Style { colour: true }, Style { colour: false }] {
            let mut md = Markdown::new(style);
            let out = md.push(evil) + &md.finish();
            assert!(
                !out.contains("\x1b]") && !out.contains("\x1b[2K") && !out.contains('\r'),
                "{out:?}"
            );
            let line = tool_call_line(style, "shell", r#"{"command": "rm -rf ~ \u001b[8m; echo hidden"}"#);
            assert!(line.contains("␛[8m"), "{line:?}");
        }
        // An approval shows the whole command, however long, on lines of its own.
        let long = format!(r#"{{"command": "echo hi{}; rm -rf ~\necho done"}}"#, " ".repeat(200));
        let target = approval_target("shell", &long);
        assert!(
            target.contains("rm -rf ~") && target.contains("\n    echo done"),
            "{target:?}"
        );
        assert_eq!(
            approval_target("write_file", r#"{"path": "a.txt", "content": "x"}"#),
            " a.txt"
        );
    }

    #[test]
    fn without_colour_the_text_is_unchanged() {
        let mut md = Markdown::new(Style { colour: false });
        assert_eq!(md.push("# a **b** `c`"), "# a **b** `c`");
        assert_eq!(md.finish(), "");
    }

    #[test]
    fn causes_are_told_in_words_with_their_code() {
        let c = Cause {
            code: "provider-unreachable".into(),
            status: None,
        };
        let w = cause_words(&c);
        assert!(
            w.contains("could not be reached") && w.ends_with("(provider-unreachable)"),
            "{w}"
        );
        let c = Cause {
            code: "something-new".into(),
            status: None,
        };
        assert_eq!(cause_words(&c), "something-new");
    }
}
