//! `$(VAR)` expansion with kubelet's semantics (`third_party/forked/golang/expansion`), used
//! for env values, command and args, and `subPathExpr`.
//!
//! Rules, scanning left to right:
//! * `$(NAME)` is replaced by NAME's value; when NAME is unknown the reference stays as
//!   written (`$(NAME)`), so `$(UNKNOWN)` survives into the command line;
//! * `$$` is an escaped `$`: `$$(NAME)` yields the literal `$(NAME)`;
//! * a `$(` without a closing `)` stays as written; a `$` followed by any other character, or
//!   at the end of the input, is literal;
//! * expansion is not recursive: a substituted value is never scanned again.
//!
//! Current behaviour: a `$` before a multi-byte character keeps the character intact (Go
//! copies its first byte only, mangling it).

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Container;

/// Expands `$(VAR)` references in `input` against `env`.
#[must_use]
pub fn expand<S: std::hash::BuildHasher>(input: &str, env: &HashMap<String, String, S>) -> String {
    expand_with(input, |name| env.get(name).map(String::as_str))
}

/// Expands `$(VAR)` references in `input`, looking names up with `lookup`; unknown names stay
/// as written.
pub fn expand_with<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let mut chars = after.chars();
        match chars.next() {
            // A trailing `$` is literal.
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after[1..].find(')') {
                Some(close) => {
                    let name = &after[1..=close];
                    match lookup(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 2..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(other) => {
                out.push('$');
                out.push(other);
                rest = chars.as_str();
            }
        }
    }
    out.push_str(rest);
    out
}

/// Why a `subPathExpr` could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("missing value for {}", missing.iter().cloned().collect::<Vec<_>>().join(", "))]
pub struct MissingVariables {
    /// Every referenced name that is unset or empty, sorted.
    pub missing: BTreeSet<String>,
}

/// kubelet's `ExpandContainerVolumeMounts`: expands a `subPathExpr`, failing when a referenced
/// variable is unset or empty (an unknown reference must not silently become a literal path).
pub fn expand_strict(input: &str, env: &[(String, String)]) -> Result<String, MissingVariables> {
    let missing = std::cell::RefCell::new(BTreeSet::new());
    let expanded = expand_with(input, |name| {
        match env.iter().rev().find(|(n, _)| n == name) {
            Some((_, value)) if !value.is_empty() => Some(value.as_str()),
            _ => {
                missing.borrow_mut().insert(name.to_owned());
                Some("")
            }
        }
    });
    let missing = missing.into_inner();
    if missing.is_empty() {
        Ok(expanded)
    } else {
        Err(MissingVariables { missing })
    }
}

/// kubelet's `ExpandContainerCommandAndArgs`: the container's `command` and `args` with
/// `$(VAR)` references expanded against its final environment `env` (later entries win).
#[must_use]
pub fn expand_command_and_args(
    container: &Container,
    env: &[(String, String)],
) -> (Vec<String>, Vec<String>) {
    let map: HashMap<String, String> = env.iter().cloned().collect();
    let expand_all = |items: &Option<Vec<String>>| {
        items
            .iter()
            .flatten()
            .map(|item| expand(item, &map))
            .collect()
    };
    (expand_all(&container.command), expand_all(&container.args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> HashMap<String, String> {
        [
            ("A", "alpha"),
            ("B", "beta"),
            ("EMPTY", ""),
            ("WEIRD NAME", "w"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn x(input: &str) -> String {
        expand(input, &env())
    }

    #[test]
    fn known_references_are_replaced() {
        assert_eq!(x("$(A)"), "alpha");
        assert_eq!(x("pre-$(A)-$(B)-post"), "pre-alpha-beta-post");
        assert_eq!(x("$(A)$(B)"), "alphabeta");
        assert_eq!(x("[$(EMPTY)]"), "[]");
        assert_eq!(x("$(WEIRD NAME)"), "w");
    }

    #[test]
    fn unknown_references_stay_as_written() {
        assert_eq!(x("$(NOPE)"), "$(NOPE)");
        assert_eq!(x("$()"), "$()");
        assert_eq!(x("a $(NOPE) $(A)"), "a $(NOPE) alpha");
    }

    #[test]
    fn a_double_dollar_escapes_the_reference() {
        assert_eq!(x("$$(A)"), "$(A)");
        assert_eq!(x("$$$(A)"), "$alpha");
        assert_eq!(x("$$$$(A)"), "$$(A)");
        assert_eq!(x("$$"), "$");
        assert_eq!(x("cost: $$5"), "cost: $5");
    }

    #[test]
    fn lone_and_unterminated_dollars_are_literal() {
        assert_eq!(x("$"), "$");
        assert_eq!(x("a$"), "a$");
        assert_eq!(x("$A"), "$A");
        assert_eq!(x("$(A"), "$(A");
        assert_eq!(x("$($(A)"), "$($(A)");
        assert_eq!(x("$(A$(B)"), "$(A$(B)");
        assert_eq!(x("$é$(A)"), "$éalpha");
        assert_eq!(x("no refs"), "no refs");
        assert_eq!(x(""), "");
    }

    #[test]
    fn expansion_is_not_recursive() {
        let mut env = env();
        env.insert("REF".into(), "$(A)".into());
        assert_eq!(expand("$(REF)", &env), "$(A)");
    }

    #[test]
    fn strict_expansion_names_every_missing_or_empty_variable() {
        let env = vec![
            ("POD".to_owned(), "p1".to_owned()),
            ("E".to_owned(), String::new()),
        ];
        assert_eq!(expand_strict("logs/$(POD)", &env).unwrap(), "logs/p1");
        let err = expand_strict("$(Z)/$(E)/$(POD)/$(A)", &env).unwrap_err();
        assert_eq!(err.to_string(), "missing value for A, E, Z");
    }

    #[test]
    fn command_and_args_are_expanded_with_the_final_environment() {
        let container = Container {
            command: Some(vec!["sh".into(), "-c".into(), "echo $(MSG) $$(MSG)".into()]),
            args: Some(vec!["$(MSG)".into(), "$(UNSET)".into()]),
            ..Container::default()
        };
        let env = vec![
            ("MSG".to_owned(), "first".to_owned()),
            ("MSG".to_owned(), "hi".to_owned()),
        ];
        let (command, args) = expand_command_and_args(&container, &env);
        assert_eq!(command, ["sh", "-c", "echo hi $(MSG)"]);
        assert_eq!(args, ["hi", "$(UNSET)"]);
    }
}
