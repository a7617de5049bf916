//! What a command's result says about the sandbox it ran in: the profile, a limit
//! that ended it, and what the sandbox denied it ([`crate::sandbox::denied`]). Shared
//! by every tool that runs a command (run_command, skill commands), as is the
//! [`Spec`] such a command starts from.

use std::path::PathBuf;

use super::{ErrorType, ToolContext, ToolResult};
use crate::exec::{Outcome, Program, Spec};
use crate::sandbox::Profile;

impl Spec {
    /// A spec for a command a tool runs on a session's behalf, with everything the
    /// call sets: the session's environment policy, the cwd, the call's deadline,
    /// cancellation, output budget and live output, and the configured sandbox and
    /// limits for the session's roots. Any tool that starts a process (run_command,
    /// skill commands) builds its spec here, so they are all contained and confined
    /// alike. Fails with the reason when the sandbox is required but unavailable.
    pub fn for_call(
        program: Program,
        cwd: impl Into<PathBuf>,
        ctx: &ToolContext,
    ) -> Result<Spec, String> {
        let mut spec = Spec::new(program, cwd);
        spec.env = ctx.env.env_policy.build();
        crate::exec::protect_git(&mut spec.env);
        spec.timeout = Some(ctx.timeout);
        spec.cancel = ctx.cancel.clone();
        spec.output_cap = ctx.env.max_output_bytes;
        spec.output = ctx.output.clone();
        if let Some((profile, limits)) = crate::sandbox::profile_for(&ctx.env.roots)? {
            spec.sandbox = Some(profile);
            spec.limits = limits;
        }
        Ok(spec)
    }
}

/// Adds to a command's result what its sandbox was (`sandbox`, `sandbox_profile`);
/// when it ran into a cgroup limit, that it was killed for it (`killed`, and an error
/// naming the limit); when it failed, what the sandbox denied (`sandbox_denied`) with a
/// line in the content saying how to ask for it.
pub fn annotate(res: ToolResult, outcome: &Outcome, profile: Option<&Profile>) -> ToolResult {
    let in_force = outcome.sandbox.as_deref().unwrap_or("none");
    let mut res = res.with_meta("sandbox", in_force);
    if let Some(limit) = &outcome.limit_hit {
        // The call was ended when it ran into the limit (see `process::run`).
        res.ok = false;
        res.error_type = Some(ErrorType::CommandFailed);
        res.error = Some(format!(
            "the call was killed: {limit}; it and every process it started were killed"
        ));
        res = res.with_meta("killed", limit.as_str());
    }
    let Some(profile) = profile else {
        return res;
    };
    res = res.with_meta("sandbox_profile", profile.summary(in_force));
    if res.ok || in_force == "none" {
        return res;
    }
    match crate::sandbox::denied::report(&outcome.stderr.text, profile) {
        Some((denied, note)) => {
            res.content.push_str(&note);
            res.with_meta("sandbox_denied", denied)
        }
        None => res,
    }
}

#[cfg(test)]
mod tests {
    use crate::tools::Registry;

    #[test]
    fn run_command_describes_the_widening_inline() {
        let registry = Registry::with_builtins();
        let tool = registry.get("run_command").unwrap_or_else(|| panic!("no run_command"));
        let schema = &tool.definition().input_schema;
        let sandbox = &schema["properties"]["sandbox"];
        assert_eq!(sandbox["type"], "object", "{schema}");
        assert!(sandbox["properties"]["writable"].is_object(), "{schema}");
        // Hosts with a strict schema dialect take no references.
        assert!(!schema.to_string().contains("$ref"), "{schema}");
    }
}
