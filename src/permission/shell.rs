//! What a `run_command` string would run, read with a real shell parser.
//!
//! A prefix rule such as `run_command(git status:*)` vouches for one program and its
//! arguments, not for arbitrary text that happens to start with those words. So the
//! command string is parsed into bash's syntax tree (brush-parser) and flattened into
//! the simple commands it contains: every part of `a && b`, `a; b`, `a | b`, `( a )`,
//! `{ a; }`, `if`/`while`/`for`/`case` bodies. Rules are matched against each part's
//! parsed words (quotes removed), never against the raw text.
//!
//! Whatever would let the text run something the rules cannot see is recorded as a
//! [`Hazard`]: command and process substitution, `eval`/`exec`/`source`, a command name
//! only known at run time, function definitions, arithmetic evaluation (which can run
//! code through array subscripts), output redirected outside the roots, an assignment to
//! a variable that changes what programs load or run (`PATH`, `LD_PRELOAD`, ...), and
//! text that cannot be parsed at all. A hazard means no specifier rule may auto-allow
//! the command. Deny and ask rules still see everything that could be found, including
//! the commands inside substitutions, `eval` strings and `sh -c` scripts, and, for text
//! the parser rejects, a best-effort split on shell operators.
//!
//! The parser reads bash, while `run_command` runs `/bin/sh`, which is often dash. So
//! syntax the two split into commands differently is a hazard too (`$'...'`, words
//! after `&>`, bash-only `${...}` forms), extended globs are left off so that `@(...)`
//! fails to parse as it does in sh, and deny rules also see sh's reading where it
//! differs.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::BufReader;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use brush_parser::ast;
use brush_parser::word::{self, Parameter, ParameterExpr, WordPiece, WordPieceWithSource};
use brush_parser::{Parser, ParserOptions};

use super::path as lexical;
use super::resolve::Resolver;

/// Longest command text handed to the parser. Real commands are a few hundred bytes;
/// a generated script of this size is better reviewed by a person than auto-allowed,
/// and the cap bounds the parser's work per decision.
const MAX_PARSE_BYTES: usize = 64 * 1024;

/// Most opening brackets and compound keywords a parsed command may contain. The
/// parser recurses once per nesting level; counting openers (an upper bound on the
/// depth) before parsing keeps adversarial input like ten thousand `(` from exhausting
/// the stack of the thread that decides. Measured: parsing and walking 96 nested brace
/// groups fits a 2 MiB thread stack in a debug build (128 does not); 48 leaves half of
/// that for the caller. Ordinary commands use a handful.
const MAX_OPENERS: usize = 48;

/// Deepest nesting of command strings inside command strings (a substitution inside an
/// `eval` inside `sh -c` ...). Beyond it the inner text is only split best-effort.
const MAX_NESTED_SOURCES: usize = 8;

/// Most commands the best-effort split of unparseable text records. Each costs a few
/// small allocations; the cap bounds memory and matching time for a pathological
/// (megabytes long) command, which the engine then refuses to vouch for.
const MAX_SPLIT_COMMANDS: usize = 4096;

/// Shell builtins that run text as code, load code, or change how later names resolve.
/// A prefix rule can never vouch for what they do.
const OPAQUE_BUILTINS: &[&str] =
    &["eval", "exec", "source", ".", "alias", "trap", "hash", "enable", "let", "fc"];

/// Builtins that neither run other programs nor touch files (unless redirected), so a
/// compound command may contain them without a rule of their own. `cd` qualifies only
/// when its target stays inside the roots.
const HARMLESS_BUILTINS: &[&str] =
    &["true", "false", ":", "pwd", "echo", "test", "[", "exit", "cd"];

/// Programs whose arguments are another command. Deny and ask rules also look at the
/// words after them, so `sudo rm -rf /` meets a deny rule for `rm`.
const WRAPPERS: &[&str] = &[
    "sudo", "doas", "env", "nice", "nohup", "timeout", "command", "builtin", "exec", "xargs",
    "stdbuf", "setsid", "ionice", "time", "unbuffer", "chrt", "taskset", "watch",
];

/// Shells whose `-c` argument is parsed as a nested script for deny and ask rules.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"];

/// Redirection targets that are not files in the workspace or anywhere else.
const DEVICE_SINKS: &[&str] = &["/dev/null", "/dev/stdout", "/dev/stderr"];

/// Variables that decide which programs, libraries, interpreter startup code or
/// configuration a command loads. Setting one in front of an allowed command turns it
/// into a different command, so such an assignment is never auto-allowed.
const DANGEROUS_VARIABLES: &[&str] = &[
    "PATH",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "IFS",
    "HOME",
    "CDPATH",
    "GLOBIGNORE",
    "SHELL",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "BROWSER",
    "ZDOTDIR",
    "XDG_CONFIG_HOME",
    "XDG_CONFIG_DIRS",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "NODE_OPTIONS",
    "NODE_PATH",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CC",
    "CXX",
    "LD",
    "AR",
    "CPP",
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "MAKEFLAGS",
    "MAKE",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "OPENSSL_CONF",
    "SSL_CERT_FILE",
    "CURL_HOME",
    "WGETRC",
    "INPUTRC",
];

/// Prefixes of dangerous variable families (loader, git, cargo, npm configuration and
/// exported shell functions).
const DANGEROUS_PREFIXES: &[&str] =
    &["LD_", "DYLD_", "GIT_", "CARGO_", "RUSTC", "NPM_CONFIG_", "BASH_FUNC_", "PIP_", "DOCKER_"];

/// Interpreters whose arguments are a program: a prefix rule naming one would allow
/// any code at all.
const INTERPRETERS: &[&str] = &[
    "python",
    "python2",
    "python3",
    "node",
    "nodejs",
    "deno",
    "bun",
    "perl",
    "ruby",
    "php",
    "lua",
    "Rscript",
    "pwsh",
    "powershell",
    "busybox",
    "osascript",
    "tclsh",
    "wish",
    "expect",
];

/// Whether a prefix rule for `program` would allow any code: a shell, a wrapper that
/// runs its arguments as a command, an interpreter, or a builtin that runs text.
pub(crate) fn runs_any_code(program: &str) -> bool {
    let name = file_name(program);
    SHELLS.contains(&name)
        || WRAPPERS.contains(&name)
        || OPAQUE_BUILTINS.contains(&name)
        || INTERPRETERS.contains(&name)
        || name.starts_with("python3.")
}

/// Whether assigning `name` in front of a command could change what that command runs.
pub(crate) fn is_dangerous_variable(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    DANGEROUS_VARIABLES.contains(&upper.as_str())
        || DANGEROUS_PREFIXES.iter().any(|prefix| upper.starts_with(prefix))
}

/// One word of a simple command after quote removal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ShellWord {
    /// Fully known text: quotes and escapes removed, nothing left to expand except
    /// pathname globbing.
    Literal(String),
    /// Only known at run time (parameter, tilde or command expansion); kept as written.
    Dynamic(String),
}

impl ShellWord {
    pub(crate) fn literal(&self) -> Option<&str> {
        match self {
            ShellWord::Literal(text) => Some(text),
            ShellWord::Dynamic(_) => None,
        }
    }

    /// The word as a person reads it: its value when known, its source otherwise.
    pub(crate) fn display(&self) -> &str {
        match self {
            ShellWord::Literal(text) | ShellWord::Dynamic(text) => text,
        }
    }
}

/// One simple command found in the text: a program (or builtin) and its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SimpleCommand {
    /// The command name and arguments, assignments and redirections removed. Empty for
    /// a command made only of assignments or redirections.
    pub(crate) words: Vec<ShellWord>,
    /// Other readings deny and ask rules are matched against: the command after a
    /// wrapper such as `sudo`, a path-qualified name reduced to its file name, and
    /// git's subcommand without the global options before it (see `alternate_views`).
    pub(crate) alternates: Vec<Vec<ShellWord>>,
    /// Found inside a substitution, an `eval` string, a function body or a `sh -c`
    /// script: deny and ask rules apply to it; allow rules need not cover it.
    pub(crate) nested: bool,
    /// Needs no rule of its own (see [`HARMLESS_BUILTINS`]).
    pub(crate) harmless: bool,
}

impl SimpleCommand {
    /// The parsed words joined by single spaces, for explanations.
    pub(crate) fn text(&self) -> String {
        if self.words.is_empty() {
            return "a bare assignment or redirection".to_owned();
        }
        let mut text = String::new();
        for word in &self.words {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(word.display());
        }
        text
    }

    /// Every word list deny and ask rules should see for this command.
    pub(crate) fn views(&self) -> impl Iterator<Item = &[ShellWord]> {
        std::iter::once(self.words.as_slice()).chain(self.alternates.iter().map(Vec::as_slice))
    }
}

/// Why a command cannot be auto-allowed by a specifier rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hazard {
    Unparseable(String),
    CommandSubstitution,
    ProcessSubstitution,
    Arithmetic,
    ComplexExpansion(String),
    DynamicCommandName(String),
    PatternInCommandName(String),
    Builtin(String),
    FunctionDefinition,
    Unsupported(&'static str),
    /// Syntax whose command boundaries differ between bash and a POSIX sh such as
    /// dash (which `/bin/sh` often is), so the parsed commands may not be the ones run.
    NotPortable(&'static str),
    RedirectOutsideRoots(PathBuf),
    UnresolvedRedirect(String),
    /// A redirection target whose symlinks cannot be followed (a loop, an unreadable
    /// directory).
    UnresolvableRedirect(PathBuf),
    /// A relative redirection after a directory change the engine cannot follow.
    RedirectAfterUnknownCd(String),
    DangerousAssignment(String),
}

impl fmt::Display for Hazard {
    /// A clause that completes "... because ...".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hazard::Unparseable(why) => write!(f, "it cannot be parsed as a shell command ({why})"),
            Hazard::CommandSubstitution => f.write_str("it contains a command substitution"),
            Hazard::ProcessSubstitution => f.write_str("it contains a process substitution"),
            Hazard::Arithmetic => f.write_str("it contains arithmetic evaluation"),
            Hazard::ComplexExpansion(word) => {
                write!(f, "it contains the parameter expansion `{word}`")
            }
            Hazard::DynamicCommandName(word) => {
                write!(f, "its command name `{word}` is only known at run time")
            }
            Hazard::PatternInCommandName(word) => {
                write!(f, "its command name `{word}` is a glob or brace pattern")
            }
            Hazard::Builtin(name) => write!(f, "it uses `{name}`"),
            Hazard::FunctionDefinition => f.write_str("it defines a shell function"),
            Hazard::Unsupported(what) => write!(f, "it uses `{what}`"),
            Hazard::NotPortable(what) => {
                write!(f, "it uses `{what}`, which sh and bash read differently")
            }
            Hazard::RedirectOutsideRoots(path) => {
                write!(f, "it redirects output to {}, outside the roots", path.display())
            }
            Hazard::UnresolvedRedirect(word) => {
                write!(f, "it redirects output to `{word}`, which is only known at run time")
            }
            Hazard::UnresolvableRedirect(path) => {
                write!(f, "it redirects output to {}, which cannot be resolved", path.display())
            }
            Hazard::RedirectAfterUnknownCd(word) => write!(
                f,
                "it redirects output to `{word}` after changing to a directory that cannot be \
                 resolved"
            ),
            Hazard::DangerousAssignment(name) => {
                write!(f, "it sets {name}, which changes what the command runs")
            }
        }
    }
}

/// Everything the permission engine needs to know about one command string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Analysis {
    /// Every simple command found, in source order (nested ones included).
    pub(crate) commands: Vec<SimpleCommand>,
    /// Reasons no specifier rule may auto-allow the text; empty for a plain command.
    pub(crate) hazards: Vec<Hazard>,
    /// The best-effort split stopped at [`MAX_SPLIT_COMMANDS`]: commands past that
    /// point were not recorded, so deny and ask rules cannot have seen them.
    pub(crate) truncated: bool,
}

/// Parses `command` as the shell would see it when started in `cwd`. Redirection
/// targets are judged where they really lead: relative to `cwd` and to every directory
/// the command's own `cd`s may enter, with symlinks followed by `resolver`.
pub(crate) fn analyze(
    command: &str,
    cwd: &Path,
    roots: &[PathBuf],
    resolver: &dyn Resolver,
) -> Analysis {
    let start = lexical::resolve(cwd, Path::new(""));
    let start = resolver.resolve(&start).unwrap_or(start);
    let mut walker = Walker {
        roots,
        resolver,
        dirs: vec![start],
        unknown_dir: false,
        analysis: Analysis::default(),
        nested_sources: 0,
        nested: false,
        redirected_writes: 0,
        options: parser_options(),
    };
    match parse(command, &walker.options) {
        Ok(program) => walker.program(&program),
        Err(why) => {
            walker.hazard(Hazard::Unparseable(why));
            walker.split_best_effort(command);
        }
    }
    walker.analysis
}

/// Bash syntax as the parser reads it, minus extended globs: `@(a|b)` is a syntax
/// error in sh, and reading it as one word would hide what sh makes of it.
fn parser_options() -> ParserOptions {
    ParserOptions { enable_extended_globbing: false, ..ParserOptions::default() }
}

/// Parses a whole program, refusing input too large or too nested to parse safely and
/// turning a parser panic into an error.
fn parse(text: &str, options: &ParserOptions) -> Result<ast::Program, String> {
    if text.len() > MAX_PARSE_BYTES {
        return Err(format!("longer than {MAX_PARSE_BYTES} bytes"));
    }
    if count_openers(text) > MAX_OPENERS {
        return Err("nested too deeply".to_owned());
    }
    let parsed = catch_unwind(AssertUnwindSafe(|| {
        Parser::new(BufReader::new(text.as_bytes()), options).parse_program()
    }));
    match parsed {
        Ok(Ok(program)) => Ok(program),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("the parser failed".to_owned()),
    }
}

/// An upper bound on the nesting depth of `text`: opening brackets, backquotes and
/// compound-command keywords.
fn count_openers(text: &str) -> usize {
    let brackets = text.bytes().filter(|b| matches!(b, b'(' | b'{' | b'[' | b'`')).count();
    let keywords = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|token| {
            matches!(*token, "if" | "while" | "until" | "for" | "case" | "select" | "function")
        })
        .count();
    brackets + keywords
}

/// Parses one word into pieces, turning a parser panic into an error.
fn parse_word(text: &str, options: &ParserOptions) -> Result<Vec<WordPieceWithSource>, String> {
    match catch_unwind(AssertUnwindSafe(|| word::parse(text, options))) {
        Ok(Ok(pieces)) => Ok(pieces),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("the word parser failed".to_owned()),
    }
}

fn parse_heredoc(text: &str, options: &ParserOptions) -> Result<Vec<WordPieceWithSource>, String> {
    match catch_unwind(AssertUnwindSafe(|| word::parse_heredoc(text, options))) {
        Ok(Ok(pieces)) => Ok(pieces),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("the here-document parser failed".to_owned()),
    }
}

/// A word after quote removal, with whether it holds unquoted glob or brace syntax.
struct WordInfo {
    word: ShellWord,
    pattern: bool,
}

/// Collects the text of a word while walking its pieces.
#[derive(Default)]
struct WordText {
    text: String,
    dynamic: bool,
    pattern: bool,
}

struct Walker<'a> {
    roots: &'a [PathBuf],
    resolver: &'a dyn Resolver,
    /// Every directory the command may be running in at this point, symlinks
    /// followed: the start directory plus each `cd` target seen so far, inside the
    /// roots or not. A relative redirection must stay inside the roots from each.
    dirs: Vec<PathBuf>,
    /// A directory change was seen whose target is not known (`cd $X`, `cd -`,
    /// `pushd`, a target that cannot be resolved): relative redirections after it
    /// cannot be judged.
    unknown_dir: bool,
    analysis: Analysis,
    /// How many command strings deep the walk is (substitution, eval, sh -c).
    nested_sources: usize,
    /// Inside a nested command string or a function body.
    nested: bool,
    /// Greater than zero inside a compound command whose output goes to a file, where
    /// no builtin counts as harmless.
    redirected_writes: usize,
    options: ParserOptions,
}

impl Walker<'_> {
    fn hazard(&mut self, hazard: Hazard) {
        if !self.analysis.hazards.contains(&hazard) {
            self.analysis.hazards.push(hazard);
        }
    }

    fn program(&mut self, program: &ast::Program) {
        for list in &program.complete_commands {
            self.list(list);
        }
    }

    fn list(&mut self, list: &ast::CompoundList) {
        for ast::CompoundListItem(and_or, _separator) in &list.0 {
            self.pipeline(&and_or.first);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(pipeline) | ast::AndOr::Or(pipeline) => self.pipeline(pipeline),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline) {
        for command in &pipeline.seq {
            self.command(command);
        }
    }

    fn command(&mut self, command: &ast::Command) {
        match command {
            ast::Command::Simple(simple) => self.simple(simple),
            ast::Command::Compound(compound, redirects) => {
                let writes = self.redirect_list(redirects.as_ref());
                self.with_redirected_writes(writes, |walker| walker.compound(compound));
            }
            ast::Command::Function(function) => {
                self.hazard(Hazard::FunctionDefinition);
                let was_nested = std::mem::replace(&mut self.nested, true);
                let ast::FunctionBody(body, redirects) = &function.body;
                let writes = self.redirect_list(redirects.as_ref());
                self.with_redirected_writes(writes, |walker| walker.compound(body));
                self.nested = was_nested;
            }
            ast::Command::ExtendedTest(test, redirects) => {
                self.hazard(Hazard::Unsupported("[[ ]]"));
                self.redirect_list(redirects.as_ref());
                self.extended_test(&test.expr);
            }
        }
    }

    fn with_redirected_writes(&mut self, writes: bool, f: impl FnOnce(&mut Self)) {
        if writes {
            self.redirected_writes += 1;
        }
        f(self);
        if writes {
            self.redirected_writes -= 1;
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand) {
        use ast::CompoundCommand as C;
        match compound {
            C::BraceGroup(group) => self.list(&group.list),
            C::Subshell(subshell) => self.list(&subshell.list),
            C::IfClause(clause) => {
                self.list(&clause.condition);
                self.list(&clause.then);
                for other in clause.elses.iter().flatten() {
                    if let Some(condition) = &other.condition {
                        self.list(condition);
                    }
                    self.list(&other.body);
                }
            }
            C::WhileClause(clause) | C::UntilClause(clause) => {
                self.list(&clause.0);
                self.list(&clause.1.list);
            }
            C::ForClause(clause) => {
                if is_dangerous_variable(&clause.variable_name) {
                    self.hazard(Hazard::DangerousAssignment(clause.variable_name.clone()));
                }
                for value in clause.values.iter().flatten() {
                    self.word(&value.value);
                }
                self.list(&clause.body.list);
            }
            C::CaseClause(clause) => {
                self.word(&clause.value.value);
                for item in &clause.cases {
                    for pattern in &item.patterns {
                        self.word(&pattern.value);
                    }
                    if let Some(body) = &item.cmd {
                        self.list(body);
                    }
                }
            }
            C::Arithmetic(arithmetic) => {
                self.hazard(Hazard::Arithmetic);
                self.arithmetic_text(&arithmetic.expr.value);
            }
            C::ArithmeticForClause(clause) => {
                self.hazard(Hazard::Arithmetic);
                for expr in
                    [&clause.initializer, &clause.condition, &clause.updater].into_iter().flatten()
                {
                    self.arithmetic_text(&expr.value);
                }
                self.list(&clause.body.list);
            }
            C::Coprocess(coprocess) => {
                self.hazard(Hazard::Unsupported("coproc"));
                self.command(&coprocess.body);
            }
        }
    }

    fn extended_test(&mut self, expr: &ast::ExtendedTestExpr) {
        use ast::ExtendedTestExpr as E;
        match expr {
            E::And(left, right) | E::Or(left, right) => {
                self.extended_test(left);
                self.extended_test(right);
            }
            E::Not(inner) | E::Parenthesized(inner) => self.extended_test(inner),
            E::UnaryTest(_, operand) => {
                self.word(&operand.value);
            }
            E::BinaryTest(_, left, right) => {
                self.word(&left.value);
                self.word(&right.value);
            }
        }
    }

    /// Arithmetic text may hold substitutions, and the parser reads some nested
    /// subshells (`( ( cmd ) )`) as arithmetic; so deny and ask rules get both the
    /// substitutions found in it and a best-effort split of the whole text.
    fn arithmetic_text(&mut self, text: &str) {
        if (text.contains("$(") || text.contains('`'))
            && let Ok(pieces) = parse_word(text, &self.options)
        {
            let mut scratch = WordText::default();
            self.pieces(text, &pieces, true, &mut scratch);
        }
        self.split_best_effort(text);
    }

    fn simple(&mut self, command: &ast::SimpleCommand) {
        let mut words = Vec::new();
        let mut writes_file = self.redirected_writes > 0;
        let mut name_is_pattern = false;
        if let Some(prefix) = &command.prefix {
            for item in &prefix.0 {
                self.item(item, /*in_prefix*/ true, &mut words, &mut writes_file);
            }
        }
        if let Some(name) = &command.word_or_name {
            let info = self.word(&name.value);
            name_is_pattern = info.pattern;
            words.push(info.word);
        }
        // Bash reads `cmd a &> file b` as one command; sh reads `cmd a &` and then
        // `> file b`, running `b`. Where sh would start a new command, in `words`.
        let mut sh_split: Option<usize> = None;
        if let Some(suffix) = &command.suffix {
            for item in &suffix.0 {
                self.item(item, /*in_prefix*/ false, &mut words, &mut writes_file);
                if matches!(
                    item,
                    ast::CommandPrefixOrSuffixItem::IoRedirect(ast::IoRedirect::OutputAndError(..))
                ) {
                    sh_split.get_or_insert(words.len());
                }
            }
        }
        if let Some(split) = sh_split.filter(|&split| split < words.len()) {
            self.hazard(Hazard::NotPortable("&>"));
            let sh_reading = words[split..].to_vec();
            let alternates = alternate_views(&sh_reading);
            self.analysis.commands.push(SimpleCommand {
                words: sh_reading,
                alternates,
                nested: true,
                harmless: false,
            });
        }

        let mut harmless = !writes_file;
        match words.first() {
            None => {}
            Some(ShellWord::Dynamic(raw)) => {
                harmless = false;
                self.hazard(Hazard::DynamicCommandName(raw.clone()));
            }
            Some(ShellWord::Literal(name)) => {
                let name = name.clone();
                if name_is_pattern {
                    self.hazard(Hazard::PatternInCommandName(name.clone()));
                }
                if OPAQUE_BUILTINS.contains(&name.as_str()) {
                    self.hazard(Hazard::Builtin(name.clone()));
                }
                let script = match name.as_str() {
                    "eval" => join_literals(&words[1..]),
                    other if SHELLS.contains(&file_name(other)) => {
                        shell_script_argument(&words[1..])
                    }
                    _ => None,
                };
                if let Some(script) = script {
                    self.nested_source(&script);
                }
                let cd_inside = match name.as_str() {
                    "cd" => self.change_dir(&words[1..]),
                    "pushd" | "popd" => {
                        self.unknown_dir = true;
                        false
                    }
                    _ => true,
                };
                harmless = harmless
                    && cd_inside
                    && !name_is_pattern
                    && HARMLESS_BUILTINS.contains(&name.as_str());
            }
        }

        let alternates = alternate_views(&words);
        self.analysis.commands.push(SimpleCommand {
            words,
            alternates,
            nested: self.nested,
            harmless,
        });
    }

    fn item(
        &mut self,
        item: &ast::CommandPrefixOrSuffixItem,
        in_prefix: bool,
        words: &mut Vec<ShellWord>,
        writes_file: &mut bool,
    ) {
        use ast::CommandPrefixOrSuffixItem as I;
        match item {
            I::IoRedirect(redirect) => {
                if self.redirect(redirect) {
                    *writes_file = true;
                }
            }
            I::Word(word) => {
                let info = self.word(&word.value);
                words.push(info.word);
            }
            I::AssignmentWord(assignment, word) => {
                if in_prefix {
                    self.assignment(assignment);
                } else {
                    // `export NAME=value` and friends: an argument like any other.
                    let info = self.word(&word.value);
                    words.push(info.word);
                }
            }
            I::ProcessSubstitution(_, subshell) => {
                self.hazard(Hazard::ProcessSubstitution);
                self.nested_list(&subshell.list);
            }
        }
    }

    fn assignment(&mut self, assignment: &ast::Assignment) {
        match &assignment.name {
            ast::AssignmentName::VariableName(name) => {
                if is_dangerous_variable(name) {
                    self.hazard(Hazard::DangerousAssignment(name.clone()));
                }
            }
            ast::AssignmentName::ArrayElementName(name, index) => {
                if is_dangerous_variable(name) {
                    self.hazard(Hazard::DangerousAssignment(name.clone()));
                }
                if !index.bytes().all(|b| b.is_ascii_digit()) {
                    self.hazard(Hazard::Arithmetic);
                }
            }
        }
        match &assignment.value {
            ast::AssignmentValue::Scalar(value) => {
                self.word(&value.value);
            }
            ast::AssignmentValue::Array(values) => {
                for (key, value) in values {
                    if let Some(key) = key {
                        self.word(&key.value);
                    }
                    self.word(&value.value);
                }
            }
        }
    }

    /// Walks a redirect list of a compound command; true if it writes to a file.
    fn redirect_list(&mut self, redirects: Option<&ast::RedirectList>) -> bool {
        let mut writes = false;
        for redirect in redirects.map(|list| list.0.as_slice()).unwrap_or_default() {
            writes |= self.redirect(redirect);
        }
        writes
    }

    /// Checks one redirection; true if it writes to a file (a device sink excepted).
    fn redirect(&mut self, redirect: &ast::IoRedirect) -> bool {
        use ast::IoFileRedirectKind as K;
        match redirect {
            ast::IoRedirect::File(_, kind, target) => {
                let writes = matches!(kind, K::Write | K::Append | K::Clobber | K::ReadAndWrite);
                match target {
                    ast::IoFileRedirectTarget::Filename(word) => {
                        if writes {
                            return self.write_target(&word.value);
                        }
                        self.word(&word.value);
                        false
                    }
                    ast::IoFileRedirectTarget::Fd(_) => false,
                    ast::IoFileRedirectTarget::Duplicate(word) => {
                        let info = self.word(&word.value);
                        let is_descriptor = info.word.literal().is_some_and(|text| {
                            text == "-" || text.bytes().all(|b| b.is_ascii_digit())
                        });
                        // `>& name` with a name that is not a descriptor sends stdout and
                        // stderr to that file.
                        if matches!(kind, K::DuplicateOutput) && !is_descriptor {
                            return self.write_target(&word.value);
                        }
                        false
                    }
                    ast::IoFileRedirectTarget::ProcessSubstitution(_, subshell) => {
                        self.hazard(Hazard::ProcessSubstitution);
                        self.nested_list(&subshell.list);
                        false
                    }
                }
            }
            ast::IoRedirect::HereDocument(_, doc) => {
                if doc.requires_expansion {
                    match parse_heredoc(&doc.doc.value, &self.options) {
                        Ok(pieces) => {
                            let mut scratch = WordText::default();
                            self.pieces(&doc.doc.value, &pieces, true, &mut scratch);
                        }
                        Err(why) => {
                            self.hazard(Hazard::Unparseable(why));
                            self.split_best_effort(&doc.doc.value);
                        }
                    }
                }
                false
            }
            ast::IoRedirect::HereString(_, word) => {
                self.word(&word.value);
                false
            }
            ast::IoRedirect::OutputAndError(word, _append) => self.write_target(&word.value),
        }
    }

    /// A file a redirection writes to: fine when it leads inside the roots (symlinks
    /// followed) from every directory the command may be in; a hazard when it leads
    /// outside, cannot be resolved, or is only known at run time. Returns whether it is
    /// a file (not a device sink).
    fn write_target(&mut self, raw: &str) -> bool {
        let info = self.word(raw);
        let target = match &info.word {
            ShellWord::Literal(target) if !info.pattern => target.clone(),
            _ => {
                self.hazard(Hazard::UnresolvedRedirect(raw.to_owned()));
                return true;
            }
        };
        if DEVICE_SINKS.contains(&target.as_str()) {
            return false;
        }
        let target = Path::new(&target);
        if self.unknown_dir && !target.is_absolute() {
            self.hazard(Hazard::RedirectAfterUnknownCd(raw.to_owned()));
            return true;
        }
        let mut found = None;
        for dir in &self.dirs {
            let joined = dir.join(target);
            match self.resolver.resolve(&joined) {
                Some(resolved) if lexical::inside_roots(&resolved, self.roots) => {}
                Some(resolved) => {
                    found = Some(Hazard::RedirectOutsideRoots(resolved));
                    break;
                }
                None => {
                    found = Some(Hazard::UnresolvableRedirect(lexical::resolve(dir, target)));
                    break;
                }
            }
        }
        if let Some(hazard) = found {
            self.hazard(hazard);
        }
        true
    }

    /// Follows a `cd`: its target, from every directory the command may be in, joins
    /// those directories (symlinks followed; as `cd` does by default, `..` is taken
    /// lexically first, and the physical reading is added too). Returns whether every
    /// target lies inside the roots; a target that cannot be known makes later
    /// relative redirections unjudgeable.
    fn change_dir(&mut self, args: &[ShellWord]) -> bool {
        let operands: Vec<&ShellWord> = args
            .iter()
            .filter(|arg| {
                !arg.literal().is_some_and(|text| text.len() > 1 && text.starts_with('-'))
            })
            .collect();
        let [ShellWord::Literal(target)] = operands.as_slice() else {
            self.unknown_dir = true;
            return false;
        };
        if target == "-" || target.is_empty() {
            self.unknown_dir = true;
            return false;
        }
        let target = Path::new(target);
        let mut inside = true;
        let mut entered = Vec::new();
        for dir in &self.dirs {
            let readings = [lexical::resolve(dir, target), dir.join(target)];
            for reading in readings {
                match self.resolver.resolve(&reading) {
                    Some(resolved) => {
                        inside &= lexical::inside_roots(&resolved, self.roots);
                        if !entered.contains(&resolved) {
                            entered.push(resolved);
                        }
                    }
                    None => {
                        inside = false;
                        self.unknown_dir = true;
                    }
                }
            }
        }
        for resolved in entered {
            if !self.dirs.contains(&resolved) {
                self.dirs.push(resolved);
            }
        }
        inside
    }

    /// Parses a command string found inside the command (substitution, `eval`
    /// argument, `sh -c` script) so deny and ask rules see its commands.
    fn nested_source(&mut self, text: &str) {
        if self.nested_sources >= MAX_NESTED_SOURCES {
            self.split_best_effort(text);
            return;
        }
        match parse(text, &self.options) {
            Ok(program) => {
                self.nested_sources += 1;
                let was_nested = std::mem::replace(&mut self.nested, true);
                self.program(&program);
                self.nested = was_nested;
                self.nested_sources -= 1;
            }
            Err(_) => self.split_best_effort(text),
        }
    }

    fn nested_list(&mut self, list: &ast::CompoundList) {
        let was_nested = std::mem::replace(&mut self.nested, true);
        self.list(list);
        self.nested = was_nested;
    }

    /// For text the parser rejects: splits on shell operators and brackets and records
    /// each piece's words as a nested command, so deny and ask rules still apply. This
    /// over-approximates (a quoted `;` splits too), which only ever denies or asks more.
    fn split_best_effort(&mut self, text: &str) {
        for segment in text.split(['\n', ';', '&', '|', '(', ')', '{', '}', '`']) {
            let words: Vec<ShellWord> = segment
                .split_whitespace()
                .map(|word| ShellWord::Literal(brush_parser::unquote_str(word)))
                .filter(|word| !word.display().is_empty())
                .collect();
            if words.is_empty() {
                continue;
            }
            if self.analysis.commands.len() >= MAX_SPLIT_COMMANDS {
                self.analysis.truncated = true;
                return;
            }
            let alternates = alternate_views(&words);
            self.analysis.commands.push(SimpleCommand {
                words,
                alternates,
                nested: true,
                harmless: false,
            });
        }
    }

    /// Quote removal for one word, recording the hazards its expansions carry.
    fn word(&mut self, raw: &str) -> WordInfo {
        match parse_word(raw, &self.options) {
            Ok(pieces) => {
                let mut text = WordText::default();
                self.pieces(raw, &pieces, false, &mut text);
                let word = if text.dynamic {
                    ShellWord::Dynamic(raw.to_owned())
                } else {
                    ShellWord::Literal(text.text)
                };
                WordInfo { word, pattern: text.pattern }
            }
            Err(why) => {
                self.hazard(Hazard::Unparseable(why));
                self.split_best_effort(raw);
                WordInfo { word: ShellWord::Dynamic(raw.to_owned()), pattern: false }
            }
        }
    }

    fn pieces(
        &mut self,
        source: &str,
        pieces: &[WordPieceWithSource],
        quoted: bool,
        out: &mut WordText,
    ) {
        for piece in pieces {
            let raw = source.get(piece.start_index..piece.end_index).unwrap_or(source);
            match &piece.piece {
                WordPiece::Text(text) => {
                    if !quoted && text.contains(['*', '?', '[', '{']) {
                        out.pattern = true;
                    }
                    out.text.push_str(text);
                }
                WordPiece::SingleQuotedText(text) => out.text.push_str(text),
                WordPiece::AnsiCQuotedText(_) => {
                    // Bash decodes `$'...'` (where `\'` does not end the quote); sh
                    // reads `$` and an ordinary single-quoted string, so the two can
                    // disagree on where the word, and the command, ends. Deny rules
                    // get a best-effort split of the text as sh might see it.
                    out.dynamic = true;
                    self.hazard(Hazard::NotPortable("$'...'"));
                    self.split_best_effort(raw);
                }
                WordPiece::DoubleQuotedSequence(inner) => self.pieces(source, inner, true, out),
                WordPiece::GettextDoubleQuotedSequence(inner) => {
                    // `$"..."`: bash may translate it, sh keeps the `$`.
                    out.dynamic = true;
                    self.pieces(source, inner, true, out);
                }
                WordPiece::TildeExpansion(_) => out.dynamic = true,
                WordPiece::ParameterExpansion(expr) => {
                    out.dynamic = true;
                    self.parameter(expr, raw);
                }
                WordPiece::CommandSubstitution(inner)
                | WordPiece::BackquotedCommandSubstitution(inner) => {
                    out.dynamic = true;
                    self.hazard(Hazard::CommandSubstitution);
                    self.nested_source(inner);
                }
                WordPiece::EscapeSequence(sequence) => {
                    let escaped = sequence.strip_prefix('\\').unwrap_or(sequence);
                    if escaped == "\n" {
                        // A line continuation.
                    } else if quoted && !matches!(escaped, "$" | "`" | "\"" | "\\") {
                        out.text.push('\\');
                        out.text.push_str(escaped);
                    } else {
                        out.text.push_str(escaped);
                    }
                }
                WordPiece::ArithmeticExpression(expr) => {
                    out.dynamic = true;
                    self.hazard(Hazard::Arithmetic);
                    self.arithmetic_text(&expr.value);
                }
            }
        }
    }

    /// Only the plain forms (`$name`, `${name}`, `$1`, `$@`, `${#name}`) are data that
    /// both sh and bash delimit alike. Every other form is a hazard: some evaluate
    /// arithmetic (subscripts, offsets), follow indirection, assign, or re-expand the
    /// value (`@P`); the rest are bash-only or quote their operands differently in sh.
    /// Operands are still walked so that deny rules see commands substituted in them.
    fn parameter(&mut self, expr: &ParameterExpr, raw: &str) {
        use ParameterExpr as P;
        let plain = match expr {
            P::Parameter { parameter, indirect } | P::ParameterLength { parameter, indirect } => {
                !indirect
                    && matches!(
                        parameter,
                        Parameter::Named(_) | Parameter::Positional(_) | Parameter::Special(_)
                    )
            }
            _ => false,
        };
        if !plain {
            self.hazard(Hazard::ComplexExpansion(raw.to_owned()));
        }
        let operands: [Option<&str>; 2] = match expr {
            P::UseDefaultValues { default_value: text, .. }
            | P::AssignDefaultValues { default_value: text, .. }
            | P::UseAlternativeValue { alternative_value: text, .. }
            | P::IndicateErrorIfNullOrUnset { error_message: text, .. }
            | P::RemoveSmallestSuffixPattern { pattern: text, .. }
            | P::RemoveLargestSuffixPattern { pattern: text, .. }
            | P::RemoveSmallestPrefixPattern { pattern: text, .. }
            | P::RemoveLargestPrefixPattern { pattern: text, .. }
            | P::UppercaseFirstChar { pattern: text, .. }
            | P::UppercasePattern { pattern: text, .. }
            | P::LowercaseFirstChar { pattern: text, .. }
            | P::LowercasePattern { pattern: text, .. } => [text.as_deref(), None],
            P::ReplaceSubstring { pattern, replacement, .. } => {
                [Some(pattern.as_str()), replacement.as_deref()]
            }
            _ => [None, None],
        };
        for operand in operands.into_iter().flatten() {
            self.inner_word(operand);
        }
    }

    /// A word embedded in a parameter expansion (a default value, a pattern): only its
    /// hazards matter.
    fn inner_word(&mut self, text: &str) {
        match parse_word(text, &self.options) {
            Ok(pieces) => {
                let mut scratch = WordText::default();
                self.pieces(text, &pieces, false, &mut scratch);
            }
            Err(why) => {
                self.hazard(Hazard::Unparseable(why));
                self.split_best_effort(text);
            }
        }
    }
}

/// The final path component of a command name (`/usr/bin/git` → `git`).
fn file_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The words of `eval`'s arguments joined as the shell would before re-parsing them,
/// if all are known.
fn join_literals(words: &[ShellWord]) -> Option<String> {
    let parts: Option<Vec<&str>> = words.iter().map(ShellWord::literal).collect();
    Some(parts?.join(" "))
}

/// The script of `sh -c SCRIPT` (also `-ec`, `-o pipefail -c` ...), if known.
fn shell_script_argument(args: &[ShellWord]) -> Option<String> {
    let mut saw_c = false;
    let mut skip_next = false;
    for arg in args {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        let text = arg.literal()?;
        if text == "-o" || text == "+o" {
            skip_next = true;
            continue;
        }
        if text == "--" {
            continue;
        }
        if (text.starts_with('-') || text.starts_with('+')) && text.len() > 1 {
            if !text.starts_with("--") && text[1..].contains('c') {
                saw_c = true;
            }
            continue;
        }
        return saw_c.then(|| text.to_owned());
    }
    None
}

/// The extra readings of a command for deny and ask rules: the command after a wrapper
/// (at every later word, so wrapper options need no parsing; `env -S` split as env
/// splits it), path-qualified names reduced to their file name, and git's subcommand
/// with the global options before it left out (see [`git_views`]).
fn alternate_views(words: &[ShellWord]) -> Vec<Vec<ShellWord>> {
    let mut views = Vec::new();
    push_file_name_view(words, &mut views);
    let wrapper = words
        .first()
        .and_then(ShellWord::literal)
        .map(file_name)
        .filter(|name| WRAPPERS.contains(name));
    // git's readings of the words from each position on, each made once however many
    // positions reach it (keyed by where in `words` it starts), so that their number
    // stays within that of the wrapper readings whatever the words repeat.
    let mut made = HashSet::new();
    let mut git = Vec::new();
    git_views(words, Some(0), &mut made, &mut git);
    if let Some(wrapper) = wrapper {
        for start in 1..words.len() {
            let view = words[start..].to_vec();
            push_file_name_view(&view, &mut views);
            git_views(&view, Some(start), &mut made, &mut git);
            views.push(view);
        }
        if wrapper == "env"
            && let Some(split) = env_split_view(&words[1..])
        {
            push_file_name_view(&split, &mut views);
            git_views(&split, None, &mut made, &mut git);
            views.push(split);
        }
    }
    views.extend(git);
    views
}

/// `env -S STRING` (`--split-string`, also joined): env splits STRING at whitespace
/// into the command and its first arguments. The reading the first such option gives.
fn env_split_view(args: &[ShellWord]) -> Option<Vec<ShellWord>> {
    for (idx, arg) in args.iter().enumerate() {
        let Some(text) = arg.literal() else { continue };
        let (string, rest) = match text {
            "-S" | "--split-string" => (args.get(idx + 1)?.literal()?, idx + 2),
            _ => match text
                .strip_prefix("--split-string=")
                .or_else(|| text.strip_prefix("-S").filter(|_| !text.starts_with("--")))
            {
                Some(string) => (string, idx + 1),
                None => continue,
            },
        };
        let mut view: Vec<ShellWord> =
            string.split_whitespace().map(|word| ShellWord::Literal(word.to_owned())).collect();
        view.extend(args.get(rest..).unwrap_or_default().iter().cloned());
        return (!view.is_empty()).then_some(view);
    }
    None
}

/// git's global options that take the next word as their value (each also takes it
/// joined, `--git-dir=...`, which any `--name=value` word is read as).
const GIT_OPTIONS_WITH_VALUE: &[&str] = &[
    "-C",
    "-c",
    "--git-dir",
    "--work-tree",
    "--namespace",
    "--super-prefix",
    "--config-env",
    "--attr-source",
    "--list-cmds",
];

/// git's global options that take no value.
const GIT_FLAGS: &[&str] = &[
    "-p",
    "--paginate",
    "-P",
    "--no-pager",
    "--bare",
    "--no-replace-objects",
    "--no-lazy-fetch",
    "--no-optional-locks",
    "--no-advice",
    "--literal-pathspecs",
    "--glob-pathspecs",
    "--noglob-pathspecs",
    "--icase-pathspecs",
    "--exec-path",
    "--html-path",
    "--man-path",
    "--info-path",
    "-v",
    "--version",
    "-h",
    "--help",
];

/// For a `git` command, readings that start `git SUBCOMMAND ...` with the global options
/// before the subcommand left out, so that `git -C . --no-pager push` meets a rule for
/// `git push`. An option git does not have here (one it may learn later), or a word
/// only known at run time where an option would be, is read both with and without a
/// value. A subcommand that a `-c alias.NAME=VALUE` of the same command defines is also
/// read as what the alias runs (`VALUE`, or for `!VALUE` the shell command).
///
/// `offset` is where `words` starts in the command's own words (`None` for a reading
/// that is no suffix of them); `made` holds what was already read from there, so the
/// same reading is never made twice.
fn git_views(
    words: &[ShellWord],
    offset: Option<usize>,
    made: &mut HashSet<(usize, usize)>,
    out: &mut Vec<Vec<ShellWord>>,
) {
    let is_git = words.first().and_then(ShellWord::literal).is_some_and(|w| file_name(w) == "git");
    if !is_git {
        return;
    }
    // Alias name → what it runs, and where in `words` that is.
    let mut aliases: HashMap<&str, (&str, usize)> = HashMap::new();
    let mut seen = vec![false; words.len()];
    let mut starts = Vec::new();
    let mut frontier = vec![1usize];
    while let Some(at) = frontier.pop() {
        let Some(word) = words.get(at) else { continue };
        if std::mem::replace(&mut seen[at], true) {
            continue;
        }
        let steps: &[usize] = match word {
            ShellWord::Literal(text) if !text.starts_with('-') => {
                starts.push(at);
                continue;
            }
            ShellWord::Literal(text) if GIT_FLAGS.contains(&text.as_str()) => &[1],
            ShellWord::Literal(text) if text.starts_with("--") && text.contains('=') => &[1],
            ShellWord::Literal(text) if GIT_OPTIONS_WITH_VALUE.contains(&text.as_str()) => {
                if text == "-c"
                    && let Some(value) = words.get(at + 1).and_then(ShellWord::literal)
                    && let Some((key, runs)) = value.split_once('=')
                    && let Some(name) = key
                        .get(..6)
                        .filter(|prefix| prefix.eq_ignore_ascii_case("alias."))
                        .and_then(|_| key.get(6..))
                {
                    // git takes the last definition of a name.
                    let alias = aliases.entry(name).or_insert((runs, at + 1));
                    if alias.1 < at + 1 {
                        *alias = (runs, at + 1);
                    }
                }
                &[2]
            }
            _ => &[1, 2],
        };
        frontier.extend(steps.iter().map(|step| at + step));
    }
    starts.sort_unstable();
    // Whether this reading (a start, and the alias read there, 0 for none) is new.
    let mut new = |start: usize, alias: usize| match offset {
        Some(offset) => made.insert((offset + start, alias)),
        None => true,
    };
    for start in starts {
        let rest = &words[start..];
        if start > 1 && new(start, 0) {
            let mut view = vec![ShellWord::Literal("git".to_owned())];
            view.extend(rest.iter().cloned());
            out.push(view);
        }
        let subcommand = rest.first().and_then(ShellWord::literal).unwrap_or_default();
        if let Some(&(runs, at)) = aliases.get(subcommand) {
            if !new(start, offset.map_or(0, |offset| offset + at)) {
                continue;
            }
            let (mut view, shell) = match runs.trim_start().strip_prefix('!') {
                Some(command) => (Vec::new(), command),
                None => (vec![ShellWord::Literal("git".to_owned())], runs),
            };
            view.extend(shell.split_whitespace().map(|word| ShellWord::Literal(word.to_owned())));
            view.extend(rest[1..].iter().cloned());
            if !view.is_empty() {
                out.push(view);
            }
        }
    }
}

fn push_file_name_view(words: &[ShellWord], views: &mut Vec<Vec<ShellWord>>) {
    if let Some(ShellWord::Literal(name)) = words.first() {
        let short = file_name(name);
        if short != name && !short.is_empty() {
            let mut view = words.to_vec();
            view[0] = ShellWord::Literal(short.to_owned());
            views.push(view);
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::super::resolve::Lexical;
    use super::*;

    /// Renders an analysis as one line per command (`+` top level, `>` nested; `h` when
    /// harmless; dynamic words in angle brackets) followed by the hazards.
    fn render(analysis: &Analysis) -> String {
        let mut out = String::new();
        for command in &analysis.commands {
            out.push(if command.nested { '>' } else { '+' });
            out.push(if command.harmless { 'h' } else { ' ' });
            for word in &command.words {
                match word {
                    ShellWord::Literal(text) => out.push_str(&format!(" [{text}]")),
                    ShellWord::Dynamic(text) => out.push_str(&format!(" <{text}>")),
                }
            }
            out.push('\n');
        }
        for hazard in &analysis.hazards {
            out.push_str(&format!("! {hazard}\n"));
        }
        out
    }

    fn check(command: &str, expect: Expect) {
        let roots = [PathBuf::from("/w/proj")];
        let analysis = analyze(command, Path::new("/w/proj"), &roots, &Lexical);
        expect.assert_eq(&render(&analysis));
    }

    #[test]
    fn simple_and_compound_commands() {
        check(
            "git  status",
            expect![[r#"
            +  [git] [status]
        "#]],
        );
        check(
            "git status && rm -rf /",
            expect![[r#"
            +  [git] [status]
            +  [rm] [-rf] [/]
        "#]],
        );
        check(
            "git status; git log\ncargo test || true | wc -l",
            expect![[r#"
            +  [git] [status]
            +  [git] [log]
            +  [cargo] [test]
            +h [true]
            +  [wc] [-l]
        "#]],
        );
        check(
            "(cd src && ls) | { grep x; }",
            expect![[r#"
            +h [cd] [src]
            +  [ls]
            +  [grep] [x]
        "#]],
        );
        check(
            "if test -f x; then make; else for f in a b; do echo $f; done; fi",
            expect![[r#"
            +h [test] [-f] [x]
            +  [make]
            +h [echo] <$f>
        "#]],
        );
    }

    #[test]
    fn quotes_are_removed_before_matching() {
        check(
            r#"'git' "sta"tus g\it"#,
            expect![[r#"
            +  [git] [status] [git]
        "#]],
        );
        check(
            r#"echo "a b" 'c  d' "$HOME" ~/x \$y"#,
            expect![[r#"
            +h [echo] [a b] [c  d] <"$HOME"> <~/x> [$y]
        "#]],
        );
    }

    #[test]
    fn substitutions_are_hazards_and_their_commands_are_seen() {
        check(
            "echo $(rm -rf /) `id`",
            expect![[r#"
            >  [rm] [-rf] [/]
            >  [id]
            +h [echo] <$(rm -rf /)> <`id`>
            ! it contains a command substitution
        "#]],
        );
        check(
            r#"echo "a $(whoami)""#,
            expect![[r#"
            >  [whoami]
            +h [echo] <"a $(whoami)">
            ! it contains a command substitution
        "#]],
        );
        check(
            "echo '$(not run)'",
            expect![[r#"
            +h [echo] [$(not run)]
        "#]],
        );
        check(
            "diff <(ls a) <(ls b)",
            expect![[r#"
            >  [ls] [a]
            >  [ls] [b]
            +  [diff]
            ! it contains a process substitution
        "#]],
        );
        check(
            "echo ${x:-$(id)} ${a[$i]} $((1+2)) ${!name}",
            expect![[r#"
                >  [id]
                >  [1+2]
                +h [echo] <${x:-$(id)}> <${a[$i]}> <$((1+2))> <${!name}>
                ! it contains the parameter expansion `${x:-$(id)}`
                ! it contains a command substitution
                ! it contains the parameter expansion `${a[$i]}`
                ! it contains arithmetic evaluation
                ! it contains the parameter expansion `${!name}`
            "#]],
        );
    }

    #[test]
    fn heredocs_expand_only_when_unquoted() {
        check(
            "cat <<EOF\nhello $(id)\nEOF\n",
            expect![[r#"
            >  [id]
            +  [cat]
            ! it contains a command substitution
        "#]],
        );
        check(
            "cat <<'EOF'\nhello $(id)\nEOF\n",
            expect![[r#"
            +  [cat]
        "#]],
        );
    }

    #[test]
    fn code_running_builtins_are_hazards() {
        check(
            "eval 'rm -rf /'",
            expect![[r#"
            >  [rm] [-rf] [/]
            +  [eval] [rm -rf /]
            ! it uses `eval`
        "#]],
        );
        check(
            "exec git status",
            expect![[r#"
            +  [exec] [git] [status]
            ! it uses `exec`
        "#]],
        );
        check(
            "source ./env.sh; . ./env.sh",
            expect![[r#"
            +  [source] [./env.sh]
            +  [.] [./env.sh]
            ! it uses `source`
            ! it uses `.`
        "#]],
        );
        check(
            "git() { rm -rf /; }; git status",
            expect![[r#"
            >  [rm] [-rf] [/]
            +  [git] [status]
            ! it defines a shell function
        "#]],
        );
        check(
            "$CMD status; {ls,-la}",
            expect![[r#"
            +  <$CMD> [status]
            +  [{ls,-la}]
            ! its command name `$CMD` is only known at run time
            ! its command name `{ls,-la}` is a glob or brace pattern
        "#]],
        );
    }

    #[test]
    fn shell_scripts_are_parsed_for_deny_rules() {
        check(
            "bash -c 'git push --force'",
            expect![[r#"
            >  [git] [push] [--force]
            +  [bash] [-c] [git push --force]
        "#]],
        );
        check(
            "sh -o pipefail -ec 'a | b'",
            expect![[r#"
            >  [a]
            >  [b]
            +  [sh] [-o] [pipefail] [-ec] [a | b]
        "#]],
        );
        check(
            "bash script.sh",
            expect![[r#"
            +  [bash] [script.sh]
        "#]],
        );
    }

    #[test]
    fn redirections() {
        check(
            "cargo test > out.txt 2>&1 >> /dev/null",
            expect![[r#"
            +  [cargo] [test]
        "#]],
        );
        check(
            "echo x > /etc/passwd; echo y >> ../outside; echo z &> sub/../../x",
            expect![[r#"
            +  [echo] [x]
            +  [echo] [y]
            +  [echo] [z]
            ! it redirects output to /etc/passwd, outside the roots
            ! it redirects output to /w/outside, outside the roots
            ! it redirects output to /w/x, outside the roots
        "#]],
        );
        check(
            "echo x >& file; echo y >&2; ls > $OUT",
            expect![[r#"
            +  [echo] [x]
            +h [echo] [y]
            +  [ls]
            ! it redirects output to `$OUT`, which is only known at run time
        "#]],
        );
        check(
            "{ echo a; } > inside.txt",
            expect![[r#"
            +  [echo] [a]
        "#]],
        );
        check(
            "cd sub && echo x > sub/../../../escape",
            expect![[r#"
            +h [cd] [sub]
            +  [echo] [x]
            ! it redirects output to /escape, outside the roots
        "#]],
        );
        // Inside the roots from the start directory, outside from the `cd` target.
        let roots = [PathBuf::from("/w/proj")];
        let analysis =
            analyze("cd /w/proj && echo x > ../x", Path::new("/w/proj/a"), &roots, &Lexical);
        assert_eq!(analysis.hazards, [Hazard::RedirectOutsideRoots(PathBuf::from("/w/x"))]);
        let analysis = analyze("echo x > ../x", Path::new("/w/proj/a"), &roots, &Lexical);
        assert_eq!(analysis.hazards, []);
        check(
            "cd /tmp; cd; cd -",
            expect![[r#"
            +  [cd] [/tmp]
            +  [cd]
            +  [cd] [-]
        "#]],
        );
    }

    #[test]
    fn assignments() {
        check(
            "FOO=1 RUST_LOG=debug cargo test",
            expect![[r#"
            +  [cargo] [test]
        "#]],
        );
        check(
            "LD_PRELOAD=/tmp/x.so PATH=/tmp:$PATH git status",
            expect![[r#"
            +  [git] [status]
            ! it sets LD_PRELOAD, which changes what the command runs
            ! it sets PATH, which changes what the command runs
        "#]],
        );
        check(
            "X=$(id) make",
            expect![[r#"
            >  [id]
            +  [make]
            ! it contains a command substitution
        "#]],
        );
        check(
            "for PATH in /tmp; do ls; done; x=1",
            expect![[r#"
            +  [ls]
            +h
            ! it sets PATH, which changes what the command runs
        "#]],
        );
        check(
            "export PATH=/evil",
            expect![[r#"
            +  [export] [PATH=/evil]
        "#]],
        );
    }

    #[test]
    fn unparseable_text_is_split_best_effort() {
        check(
            "echo 'unterminated; rm -rf /",
            expect![[r#"
            >  [echo] [unterminated]
            >  [rm] [-rf] [/]
            ! it cannot be parsed as a shell command (unterminated single quote at 1,6 (detected near line 1 col 29))
        "#]],
        );
        check(
            "if then fi (",
            expect![[r#"
            >  [if] [then] [fi]
            ! it cannot be parsed as a shell command (syntax error at line 1 col 9)
        "#]],
        );
    }

    #[test]
    fn syntax_sh_and_bash_split_differently_is_a_hazard() {
        // Bash: one echo. Dash: `echo $a\ ;` then `rm -rf /` then a comment.
        check(
            r"echo $'a\' ; rm -rf / ; #'",
            expect![[r#"
                >  [$a']
                >  [rm] [-rf] [/]
                >  [#]
                +h [echo] <$'a\' ; rm -rf / ; #'>
                ! it uses `$'...'`, which sh and bash read differently
            "#]],
        );
        // Bash: echo with four arguments. Sh: `echo hi &` then `>/dev/null rm -rf /`.
        check(
            "echo hi &>/dev/null rm -rf /",
            expect![[r#"
                >  [rm] [-rf] [/]
                +h [echo] [hi] [rm] [-rf] [/]
                ! it uses `&>`, which sh and bash read differently
            "#]],
        );
        check(
            "cargo test &> out.txt",
            expect![[r#"
            +  [cargo] [test]
        "#]],
        );
        check(
            "echo @(a|b)",
            expect![[r#"
            >  [echo] [@]
            >  [a]
            >  [b]
            ! it cannot be parsed as a shell command (syntax error at line 1 col 9)
        "#]],
        );
        check(
            r#"echo "${x/'}'/y}" ${x:-default} $"text" ${#x} $1 $@"#,
            expect![[r#"
            +h [echo] <"${x/'}'/y}"> <${x:-default}> <$"text"> <${#x}> <$1> <$@>
            ! it contains the parameter expansion `${x/'}'/y}`
            ! it contains the parameter expansion `${x:-default}`
        "#]],
        );
    }

    #[test]
    fn unsupported_constructs_are_hazards() {
        check(
            "[[ -f x ]] && (( n++ )); coproc cat",
            expect![[r#"
            >  [n++]
            +  [cat]
            ! it uses `[[ ]]`
            ! it contains arithmetic evaluation
            ! it uses `coproc`
        "#]],
        );
    }

    #[test]
    fn wrappers_expose_the_wrapped_command() {
        let roots = [PathBuf::from("/w")];
        let analysis = analyze("sudo -u root /bin/rm -rf /", Path::new("/w"), &roots, &Lexical);
        let views: Vec<String> = analysis.commands[0]
            .views()
            .map(|view| view.iter().map(ShellWord::display).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(
            views,
            [
                "sudo -u root /bin/rm -rf /",
                "-u root /bin/rm -rf /",
                "root /bin/rm -rf /",
                "rm -rf /",
                "/bin/rm -rf /",
                "-rf /",
                "/",
            ]
        );
    }

    #[test]
    fn git_readings_stay_as_many_as_the_words() {
        let roots = [PathBuf::from("/w")];
        // Every word after a wrapper starts a reading; git's readings of those that
        // start with git, and its aliases, are each made once.
        let repeated = "git --u ".repeat(200);
        for text in [format!("sudo {repeated}a"), format!("env -S 'git --u' {repeated}a")] {
            let analysis = analyze(&text, Path::new("/w"), &roots, &Lexical);
            let command = &analysis.commands[0];
            let words = command.words.len();
            let views = command.views().count();
            assert!(views <= 4 * words, "{views} readings of {words} words");
        }
        // The last definition of an alias is the one git runs.
        let analysis =
            analyze("git -c alias.p=status -c alias.p=push p", Path::new("/w"), &roots, &Lexical);
        let views: Vec<String> = analysis.commands[0]
            .views()
            .map(|view| view.iter().map(ShellWord::display).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(views, ["git -c alias.p=status -c alias.p=push p", "git p", "git push"]);
    }

    #[test]
    fn adversarial_nesting_is_refused_without_recursing() {
        let deep = "(".repeat(100_000);
        check(
            &deep[..200],
            expect![[r#"
            ! it cannot be parsed as a shell command (nested too deeply)
        "#]],
        );
        let analysis = analyze(&deep, Path::new("/w"), &[PathBuf::from("/w")], &Lexical);
        assert_eq!(analysis.hazards, [Hazard::Unparseable("longer than 65536 bytes".to_owned())]);
        // Just under the limit still parses on a test thread's stack.
        let nested = format!("{}true{}", "{ ".repeat(MAX_OPENERS), "; }".repeat(MAX_OPENERS));
        let analysis = analyze(&nested, Path::new("/w"), &[PathBuf::from("/w")], &Lexical);
        assert_eq!(analysis.hazards, []);
        assert_eq!(analysis.commands.len(), 1);
    }

    #[test]
    fn the_best_effort_split_is_bounded() {
        let roots = [PathBuf::from("/w")];
        let huge = "a;".repeat(MAX_PARSE_BYTES);
        let analysis = analyze(&huge, Path::new("/w"), &roots, &Lexical);
        assert_eq!(analysis.commands.len(), MAX_SPLIT_COMMANDS);
        assert!(analysis.truncated);
        let small = analyze("echo 'x; y", Path::new("/w"), &roots, &Lexical);
        assert!(!small.truncated);
    }

    #[test]
    fn dangerous_variables() {
        for name in ["PATH", "ld_preload", "LD_LIBRARY_PATH", "BASH_ENV", "GIT_SSH_COMMAND", "IFS"]
        {
            assert!(is_dangerous_variable(name), "{name}");
        }
        for name in ["FOO", "RUST_LOG", "RUST_BACKTRACE", "CI", "NO_COLOR", "LANG"] {
            assert!(!is_dangerous_variable(name), "{name}");
        }
    }
}
