//! How a call was finally decided: one typed value for the events, the audit log and
//! the protocol, instead of words such as `ask→timeout`.

use std::borrow::Cow;

use super::{CallDecision, DecidedBy, Explanation, Layer, Outcome};

impl CallDecision {
    /// A decision without an engine verdict behind it.
    pub fn new(outcome: Outcome, decided_by: DecidedBy) -> CallDecision {
        CallDecision { outcome, decided_by, asked: false, layer: None, rule: None, list: None }
    }

    /// The engine's verdict, settled by the layer that explains it.
    pub fn of(outcome: Outcome, explanation: &Explanation) -> CallDecision {
        CallDecision::new(outcome, decided_by_layer(explanation.layer)).explained(explanation)
    }

    /// The layer, rule and list of an explanation.
    pub fn explained(mut self, explanation: &Explanation) -> CallDecision {
        self.layer = Some(explanation.layer);
        self.rule = explanation.rule.clone();
        self.list = explanation.list;
        self
    }

    pub fn asked(mut self) -> CallDecision {
        self.asked = true;
        self
    }

    /// The rule that decided, as the audit log writes it: `<list>: <rule as written>`,
    /// or the layer's name when no rule did (`mode`, `session_grant`, `hook`).
    pub fn rule_text(&self) -> Option<Cow<'static, str>> {
        match (&self.rule, self.list, self.layer) {
            (Some(rule), Some(list), _) => Some(Cow::Owned(format!("{}: {rule}", list.as_str()))),
            (Some(rule), None, _) => Some(Cow::Owned(rule.clone())),
            (None, _, Some(layer)) => Some(Cow::Borrowed(layer_name(layer))),
            (None, _, None) => None,
        }
    }
}

fn decided_by_layer(layer: Layer) -> DecidedBy {
    match layer {
        Layer::System => DecidedBy::System,
        Layer::Rule => DecidedBy::Rule,
        Layer::Mode => DecidedBy::Mode,
        Layer::SessionGrant => DecidedBy::SessionGrant,
        Layer::Hook => DecidedBy::Hook,
        // Paths outside the roots are refused where the tool opens them.
        Layer::Confinement => DecidedBy::Registry,
        // The kernel refuses what the sandbox does not grant, inside the command.
        Layer::Sandbox => DecidedBy::Registry,
    }
}

/// The wire name of a layer (as serde writes it).
fn layer_name(layer: Layer) -> &'static str {
    match layer {
        Layer::System => "system",
        Layer::Rule => "rule",
        Layer::Mode => "mode",
        Layer::SessionGrant => "session_grant",
        Layer::Hook => "hook",
        Layer::Confinement => "confinement",
        Layer::Sandbox => "sandbox",
    }
}

#[cfg(test)]
mod tests {
    use super::super::RuleList;
    use super::*;

    fn explanation(layer: Layer, rule: Option<&str>, list: Option<RuleList>) -> Explanation {
        Explanation { layer, rule: rule.map(str::to_owned), list, reason: "because".to_owned() }
    }

    #[test]
    fn the_rule_is_written_as_configured_with_its_list() {
        let by_rule = CallDecision::of(
            Outcome::Allow,
            &explanation(Layer::Rule, Some("Bash(git Status:*)"), Some(RuleList::Allow)),
        );
        assert_eq!(by_rule.decided_by, DecidedBy::Rule);
        assert_eq!(by_rule.rule_text().as_deref(), Some("allow: Bash(git Status:*)"));
        let granted = CallDecision::of(
            Outcome::Allow,
            &explanation(Layer::SessionGrant, Some("run_command(ls:*)"), Some(RuleList::Allow)),
        );
        assert_eq!(granted.decided_by, DecidedBy::SessionGrant);
        assert_eq!(granted.rule_text().as_deref(), Some("allow: run_command(ls:*)"));
        let by_mode =
            CallDecision::of(Outcome::Deny, &explanation(Layer::SessionGrant, None, None));
        assert_eq!(by_mode.rule_text().as_deref(), Some("session_grant"));
        assert_eq!(CallDecision::new(Outcome::Allow, DecidedBy::Registry).rule_text(), None);
    }

    #[test]
    fn one_serialisation_names_who_decided() {
        let decision = CallDecision::new(Outcome::Deny, DecidedBy::Timeout)
            .explained(&explanation(Layer::Rule, Some("Edit(src/**)"), Some(RuleList::Ask)))
            .asked();
        assert_eq!(
            serde_json::to_value(&decision).unwrap(),
            serde_json::json!({
                "outcome": "deny", "decided_by": "timeout", "asked": true,
                "layer": "rule", "rule": "Edit(src/**)", "list": "ask"
            })
        );
        let plain = CallDecision::new(Outcome::Allow, DecidedBy::Mode);
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            serde_json::json!({"outcome": "allow", "decided_by": "mode"})
        );
    }
}
