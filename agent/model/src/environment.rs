//! A container's environment as it is built: variables in definition order, Kubernetes'
//! `$(VAR)` expansion against what is defined before, and the bounds that keep that expansion
//! from growing without end. Pure.
//!
//! The expansion rules are the kubelet's, and like the kubelet's they are exponential: with
//! `A` = 1 KB, `B` = `$(A)` × 1000, `C` = `$(B)` × 1000, a 15 KB spec asks for terabytes. So
//! every value is bounded as it is produced, never after: one variable at most
//! [`MAX_VALUE_BYTES`] (Linux's own limit on one `execve` string), the whole environment and
//! arguments at most [`MAX_TOTAL_BYTES`]. The API checks what it can compute (literal `value`s,
//! `command` and `args`) through the same type; the kubelet checks everything again.

use std::collections::BTreeMap;

/// The most bytes one variable or argument may hold once expanded: Linux's `MAX_ARG_STRLEN`
/// (32 pages); `execve` refuses a longer string anyway.
pub const MAX_VALUE_BYTES: usize = 128 << 10;

/// The most bytes a container's environment and arguments may hold in all, once expanded
/// (`execve` takes at most a quarter of the stack limit: 2 MiB with the default 8 MiB).
pub const MAX_TOTAL_BYTES: usize = 1 << 20;

/// What went over a bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooLarge {
    /// One value (of the variable or argument the caller names) would pass [`MAX_VALUE_BYTES`].
    Value,
    /// The environment and arguments together would pass [`MAX_TOTAL_BYTES`].
    Total,
}

impl TooLarge {
    /// The reason, for a message that names the variable or argument first.
    pub fn reason(&self) -> String {
        match self {
            TooLarge::Value => {
                format!("expands to more than {MAX_VALUE_BYTES} bytes")
            }
            TooLarge::Total => format!(
                "makes the container's environment and arguments larger than {MAX_TOTAL_BYTES} bytes"
            ),
        }
    }
}

/// The environment being built, with the bytes it holds (names, values and arguments).
#[derive(Debug, Default, Clone)]
pub struct Environment {
    vars: BTreeMap<String, String>,
    order: Vec<String>,
    total_bytes: usize,
}

impl Environment {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.vars.contains_key(name)
    }

    /// Defines (or redefines) `name`; a later definition replaces the value but keeps the
    /// first one's place.
    pub fn set(&mut self, name: String, value: String) -> Result<(), TooLarge> {
        if value.len() > MAX_VALUE_BYTES {
            return Err(TooLarge::Value);
        }
        // A redefinition replaces the old value's bytes; a new variable adds `NAME=`.
        let (old, new) = match self.vars.get(&name) {
            Some(old) => (old.len(), value.len()),
            None => (0, name.len() + 1 + value.len()),
        };
        let total = self.total_bytes - old + new;
        if total > MAX_TOTAL_BYTES {
            return Err(TooLarge::Total);
        }
        self.total_bytes = total;
        if !self.vars.contains_key(&name) {
            self.order.push(name.clone());
        }
        self.vars.insert(name, value);
        Ok(())
    }

    /// Counts an argument (`command` or `args`) of `len` bytes against the total.
    pub fn count_argument(&mut self, len: usize) -> Result<(), TooLarge> {
        if len > MAX_VALUE_BYTES {
            return Err(TooLarge::Value);
        }
        let total = self.total_bytes.saturating_add(len);
        if total > MAX_TOTAL_BYTES {
            return Err(TooLarge::Total);
        }
        self.total_bytes = total;
        Ok(())
    }

    /// Kubernetes' `$(VAR)` expansion of `text`: defined variables are replaced, `$$` is a
    /// literal `$`, anything else is left as written. Fails as soon as the result would pass
    /// [`MAX_VALUE_BYTES`], before it is built.
    pub fn expand(&self, text: &str) -> Result<String, TooLarge> {
        let mut out = String::with_capacity(text.len().min(MAX_VALUE_BYTES));
        let push = |out: &mut String, piece: &str| {
            if out.len() + piece.len() > MAX_VALUE_BYTES {
                return Err(TooLarge::Value);
            }
            out.push_str(piece);
            Ok(())
        };
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            push(&mut out, &rest[..at])?;
            let after = &rest[at + 1..];
            if let Some(stripped) = after.strip_prefix('$') {
                push(&mut out, "$")?;
                rest = stripped;
            } else if let Some(inner) = after.strip_prefix('(')
                && let Some(end) = inner.find(')')
                && let Some(value) = self.vars.get(&inner[..end])
            {
                push(&mut out, value)?;
                rest = &inner[end + 1..];
            } else {
                push(&mut out, "$")?;
                rest = after;
            }
        }
        push(&mut out, rest)?;
        Ok(out)
    }

    /// `NAME=value` lines in definition order.
    pub fn to_lines(&self) -> Vec<String> {
        self.order
            .iter()
            .map(|k| format!("{k}={}", self.vars[k]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Environment {
        let mut env = Environment::new();
        for (k, v) in vars {
            env.set((*k).into(), (*v).into()).unwrap();
        }
        env
    }

    #[test]
    fn expansion_rules() {
        let e = env(&[("A", "1")]);
        assert_eq!(e.expand("$(A)-$(B)-$$(A)-$").unwrap(), "1-$(B)-$(A)-$");
        assert_eq!(e.expand("$(A").unwrap(), "$(A");
    }

    #[test]
    fn later_definitions_keep_their_place_and_count_once() {
        let mut e = env(&[("A", "1"), ("B", "2")]);
        e.set("A".into(), "333".into()).unwrap();
        assert_eq!(e.to_lines(), ["A=333", "B=2"]);
        assert_eq!(e.total_bytes, "A=333".len() + "B=2".len());
    }

    /// The doubling chain that once asked for terabytes stops at the bound, after building at
    /// most one bounded value (issue #35, item 2).
    #[test]
    fn exponential_expansion_stops_at_the_bound() {
        let mut e = env(&[("A", &"x".repeat(1000))]);
        let thousand = |name: &str| format!("$({name})").repeat(1000);
        let b = e.expand(&thousand("A"));
        assert_eq!(b, Err(TooLarge::Value), "1000 × 1 KB is past 128 KiB");
        // Just under the bound passes; the total then catches many of them.
        let a100 = e.expand(&"$(A)".repeat(100)).unwrap();
        assert_eq!(a100.len(), 100_000);
        let mut last = Ok(());
        for i in 0..20 {
            last = e.set(format!("V{i}"), a100.clone());
            if last.is_err() {
                break;
            }
        }
        assert_eq!(last, Err(TooLarge::Total));
        assert!(e.total_bytes <= MAX_TOTAL_BYTES);
        assert_eq!(e.count_argument(MAX_VALUE_BYTES + 1), Err(TooLarge::Value));
    }
}
