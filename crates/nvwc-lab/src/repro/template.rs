//! Report templates: the prose of a report lives in
//! `reports/templates/<report>.md`, with named placeholders `{{name}}` where
//! a computed value (a number, a table, a list) goes.
//!
//! A template and its values MUST match exactly: every placeholder gets a
//! value and every value is used, so a number cannot be typed into the prose
//! by mistake (it would have no value to come from) nor computed and then
//! silently dropped.

use std::collections::BTreeMap;

/// Why a template could not be filled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// A placeholder that no value fills.
    #[error("template {template}: no value for {{{{{name}}}}}")]
    Missing { template: String, name: String },
    /// A value that no placeholder uses.
    #[error("template {template}: value {name:?} is not used")]
    Unused { template: String, name: String },
    /// A value given twice.
    #[error("template {template}: value {name:?} given twice")]
    Duplicate { template: String, name: String },
    /// `{{` without its `}}`.
    #[error("template {template}: unclosed placeholder at byte {at}")]
    Unclosed { template: String, at: usize },
}

/// A template's text and name (the name is for error messages).
#[derive(Clone, Copy, Debug)]
pub struct Template {
    pub name: &'static str,
    pub text: &'static str,
}

/// The values for one template, in the order they are computed.
#[derive(Default, Debug)]
pub struct Values(Vec<(&'static str, String)>);

impl Values {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` to `value` (displayed with `{}`).
    pub fn set(&mut self, name: &'static str, value: impl std::fmt::Display) -> &mut Self {
        self.0.push((name, value.to_string()));
        self
    }
}

impl Template {
    /// The text with every `{{name}}` replaced by its value.
    ///
    /// Fails if a placeholder has no value, a value is unused or given twice,
    /// or a `{{` is not closed. A placeholder's name is trimmed, so
    /// `{{ name }}` and `{{name}}` are the same.
    pub fn fill(&self, values: &Values) -> Result<String, TemplateError> {
        let mut map: BTreeMap<&str, (&str, bool)> = BTreeMap::new();
        for (k, v) in &values.0 {
            if map.insert(k, (v.as_str(), false)).is_some() {
                return Err(TemplateError::Duplicate {
                    template: self.name.into(),
                    name: (*k).into(),
                });
            }
        }
        let mut out = String::with_capacity(self.text.len());
        let mut rest = self.text;
        while let Some(i) = rest.find("{{") {
            out.push_str(&rest[..i]);
            let after = &rest[i + 2..];
            let Some(j) = after.find("}}") else {
                return Err(TemplateError::Unclosed {
                    template: self.name.into(),
                    at: self.text.len() - rest.len() + i,
                });
            };
            let name = after[..j].trim();
            let Some(slot) = map.get_mut(name) else {
                return Err(TemplateError::Missing {
                    template: self.name.into(),
                    name: name.into(),
                });
            };
            out.push_str(slot.0);
            slot.1 = true;
            rest = &after[j + 2..];
        }
        out.push_str(rest);
        if let Some((k, _)) = map.iter().find(|(_, (_, used))| !used) {
            return Err(TemplateError::Unused {
                template: self.name.into(),
                name: (*k).into(),
            });
        }
        debug_assert!(
            !out.contains("{{"),
            "a filled template has no placeholder left"
        );
        Ok(out)
    }
}

/// `include_str!` of `reports/templates/<file>` as a [`Template`].
macro_rules! template {
    ($file:literal) => {
        $crate::repro::template::Template {
            name: $file,
            text: include_str!(concat!("../../../../reports/templates/", $file)),
        }
    };
}
pub(crate) use template;

#[cfg(test)]
mod tests {
    use super::*;

    const T: Template = Template {
        name: "t",
        text: "a {{x}} b {{ y }} c {{x}}",
    };

    #[test]
    fn fills_every_placeholder() {
        let mut v = Values::new();
        v.set("x", 1).set("y", "two");
        assert_eq!(T.fill(&v).unwrap(), "a 1 b two c 1");
    }

    #[test]
    fn refuses_missing_unused_duplicate_and_unclosed() {
        let mut v = Values::new();
        v.set("x", 1);
        assert!(matches!(T.fill(&v), Err(TemplateError::Missing { name, .. }) if name == "y"));
        v.set("y", 2).set("z", 3);
        assert!(matches!(T.fill(&v), Err(TemplateError::Unused { name, .. }) if name == "z"));
        let mut d = Values::new();
        d.set("x", 1).set("x", 2);
        assert!(matches!(T.fill(&d), Err(TemplateError::Duplicate { .. })));
        let open = Template {
            name: "open",
            text: "a {{x",
        };
        assert_eq!(
            open.fill(&Values::new()),
            Err(TemplateError::Unclosed {
                template: "open".into(),
                at: 2
            })
        );
    }
}
