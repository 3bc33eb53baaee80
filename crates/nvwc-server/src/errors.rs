//! Printing an error with its causes.

/// `error: cause: cause ...`, each cause once. An error whose message
/// already ends with its cause's (a `thiserror` variant like
/// `#[error("reading {file}: {source}")]`) would otherwise print that cause
/// twice, as anyhow's `{:#}` does.
pub fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.is_empty() {
            out = s;
        } else if !s.is_empty() && !out.ends_with(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::chain;
    use anyhow::Context;

    #[derive(Debug, thiserror::Error)]
    #[error("I/O error: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn each_cause_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = Err::<(), _>(Repeats(io()))
            .context("connecting to /x")
            .unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "connecting to /x: I/O error: entity not found: entity not found"
        );
        assert_eq!(chain(&e), "connecting to /x: I/O error: entity not found");
        let e = Err::<(), _>(io())
            .context("opening f")
            .context("export \"a\"")
            .unwrap_err();
        assert_eq!(chain(&e), "export \"a\": opening f: entity not found");
    }
}
