//! notebook_edit: replaces, inserts or deletes one cell of a Jupyter notebook, and the
//! notebook rendering read_file shows.
//!
//! A notebook is JSON, but rewriting it from a parsed value would reorder keys, change
//! indentation and number formatting, and show up as a diff of the whole file. So the
//! edit is surgical: the file's text is scanned for the byte spans of the cells and
//! their `source`, only the span that changes is replaced, and the new text is written
//! in the notebook's own style (its indentation, sorted keys as nbformat writes them,
//! `\uXXXX` escapes when the file uses them). Everything else keeps its bytes; a cell
//! replaced by the text it already has leaves the file byte for byte the same.
//!
//! The notebook's style includes its indentation, repeated on every line of a cell
//! written in it, so a short source can make a long text: what is rendered is bounded
//! by the read limit (`[limits] max_read_bytes`) as it is written, and an edit that
//! would make the notebook larger is refused (`too_large`) before more is built.

use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, LazyLock};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::tools::facts::{ClaudeCode, ClaudeTool, PathAccess, PathArgument, Subject};
use crate::tools::fs::{self, FileStamp, FsError, ParentDirs, ResolvedParent, Staleness};
use crate::tools::{
    Attachment, Definition, Env, ErrorType, Facts, Safety, Tool, ToolContext, ToolResult,
    parse_args, schema_for,
};

/// Characters of one output shown by read_file.
const MAX_OUTPUT_CHARS: usize = 4000;

#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum EditAction {
    #[default]
    Replace,
    Insert,
    Delete,
}

#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum CellType {
    Code,
    Markdown,
    Raw,
}

impl CellType {
    fn as_str(self) -> &'static str {
        match self {
            CellType::Code => "code",
            CellType::Markdown => "markdown",
            CellType::Raw => "raw",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The notebook (.ipynb), relative to the working directory or absolute (inside the roots).
    path: String,
    /// The cell's id (as read_file shows it). For insert: the new cell goes after it.
    cell_id: Option<String>,
    /// The cell's 0-based position (as read_file shows it). For insert: the new cell's
    /// position (default: after cell_id, else at the start).
    #[schemars(range(min = 0))]
    index: Option<u64>,
    /// replace (default), insert or delete.
    #[serde(default)]
    action: EditAction,
    /// The cell's new source; required for replace and insert.
    source: Option<String>,
    /// The cell type: required for insert; for replace, changes the cell's type.
    cell_type: Option<CellType>,
}

struct NotebookEdit {
    definition: Definition,
}

pub fn tool() -> Arc<dyn Tool> {
    static DESCRIPTION: &str = "Edits one cell of a Jupyter notebook (.ipynb) inside the \
        session roots: action replace (default) sets a cell's source (and optionally its \
        cell_type), insert adds a cell (cell_type required) at index or after cell_id, \
        delete removes a cell. Name the cell by cell_id or by its 0-based index, as \
        read_file shows them. The notebook must have been read with read_file in this \
        session and not changed since. The rest of the file keeps its exact formatting and \
        metadata.";
    static DEFINITION: LazyLock<Definition> = LazyLock::new(|| Definition {
        name: "notebook_edit".to_owned(),
        description: DESCRIPTION.to_owned(),
        input_schema: schema_for::<Args>(),
        safety: Safety::SideEffect,
        system: false,
        timeout: None,
        facts: Facts {
            subject: Subject::Paths(&[PathArgument {
                name: "path",
                default: None,
                access: PathAccess::Write,
            }]),
            edits: true,
            binds_access: false,
            claude_code: ClaudeCode::Tool(ClaudeTool {
                name: "NotebookEdit",
                aliases: &[],
                fields: &[
                    ("path", "notebook_path"),
                    ("source", "new_source"),
                    ("action", "edit_mode"),
                ],
            }),
        },
    });
    Arc::new(NotebookEdit { definition: DEFINITION.clone() })
}

#[async_trait::async_trait]
impl Tool for NotebookEdit {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(res) => return res,
        };
        let invalid = |message: &str| ToolResult::failure(ErrorType::InvalidArguments, message);
        if !args.path.ends_with(".ipynb") {
            return invalid("notebook_edit only edits Jupyter notebooks (.ipynb files)");
        }
        match args.action {
            EditAction::Replace | EditAction::Delete
                if args.cell_id.is_none() && args.index.is_none() =>
            {
                return invalid("name the cell by cell_id or index");
            }
            EditAction::Replace | EditAction::Insert if args.source.is_none() => {
                return invalid("source is required to replace or insert a cell");
            }
            EditAction::Insert if args.cell_type.is_none() => {
                return invalid("cell_type is required to insert a cell");
            }
            _ => {}
        }
        let env = ctx.env.clone();
        let cancel = ctx.cancel.clone();
        let path = args.path.clone();
        fs::with_write_lock(&ctx.env, &path, ParentDirs::MustExist, move |target| {
            edit_locked(&env, &args, target, &cancel)
        })
        .await
        .unwrap_or_else(ToolResult::from)
    }
}

fn edit_locked(
    env: &Env,
    args: &Args,
    target: &ResolvedParent,
    cancel: &CancellationToken,
) -> Result<ToolResult, FsError> {
    let key = target.path();
    let shown_path = key.display().to_string();
    let Some((file, info)) = fs::open_existing(target, &args.path)? else {
        return Err(fs::missing(&args.path, &key));
    };
    let bytes = fs::read_capped(file, &info, env.max_read_bytes, &args.path)?;
    let current = FileStamp::of(&info, &bytes);
    if let Some(message) = Staleness::check(&env.files, &key, &current).message(&args.path) {
        return Ok(ToolResult::failure(ErrorType::StaleFile, message).with_meta("path", shown_path));
    }
    let refuse = |error_type: ErrorType, message: String| {
        Ok(ToolResult::failure(error_type, message).with_meta("path", shown_path.clone()))
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return refuse(
            ErrorType::BinaryFile,
            format!("{} is not UTF-8 JSON", fs::shorten(&args.path)),
        );
    };
    let notebook = match Notebook::scan(text) {
        Ok(notebook) => notebook,
        Err(problem) => {
            return refuse(
                ErrorType::InvalidArguments,
                format!(
                    "{} is not a notebook this tool can edit: {problem}",
                    fs::shorten(&args.path)
                ),
            );
        }
    };
    let limit = usize::try_from(env.max_read_bytes).unwrap_or(usize::MAX);
    let edited = match notebook.edit(text, args, limit) {
        Ok(edited) => edited,
        Err((error_type, message)) => return refuse(error_type, message),
    };
    if cancel.is_cancelled() {
        return Ok(ToolResult::failure(ErrorType::Canceled, "the call was canceled"));
    }
    let changed = edited.text != text;
    if changed {
        let stamp =
            fs::write_atomic_replacing(&target.dir, &target.name, edited.text.as_bytes(), &info)
                .map_err(|err| FsError::from_io(&args.path, err))?;
        env.files.record(key, stamp);
    }
    let verb = match (args.action, changed) {
        (_, false) => "left unchanged (the cell already had this content)",
        (EditAction::Replace, true) => "replaced",
        (EditAction::Insert, true) => "inserted",
        (EditAction::Delete, true) => "deleted",
    };
    let mut res = ToolResult::success(format!("cell {} {verb} in {shown_path}", edited.index))
        .with_meta("path", shown_path)
        .with_meta("index", edited.index)
        .with_meta("changed", changed)
        .with_meta("cells", edited.cells);
    if let Some(id) = edited.id {
        res = res.with_meta("cell_id", id);
    }
    Ok(res)
}

// ---------------------------------------------------------------------------------
// Scanning the notebook's text.

/// A byte range of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: usize,
    end: usize,
}

/// One member of a JSON object: its key and where its value is.
#[derive(Clone, Debug)]
struct Member {
    key: String,
    key_start: usize,
    value: Span,
}

#[derive(Clone, Debug)]
struct CellSpan {
    span: Span,
    members: Vec<Member>,
    value: Value,
}

impl CellSpan {
    fn member(&self, key: &str) -> Option<&Member> {
        self.members.iter().find(|member| member.key == key)
    }

    fn id(&self) -> Option<&str> {
        self.value.get("id").and_then(Value::as_str)
    }
}

/// The notebook's layout: where its cells are and how it is indented.
#[derive(Debug)]
struct Notebook {
    /// The `[` … `]` of the cells array.
    cells_array: Span,
    /// Column of the `"cells"` key (the indentation of one level), when indented.
    cells_key_column: usize,
    cells: Vec<CellSpan>,
    /// Indentation step in spaces; `None` for a notebook written on one line.
    unit: Option<usize>,
    /// The file escapes non-ASCII characters (`\uXXXX`).
    ascii: bool,
    /// nbformat 4.5 and later give every cell an id.
    uses_ids: bool,
}

/// The result of an edit.
struct Edited {
    text: String,
    index: usize,
    id: Option<String>,
    cells: usize,
}

type EditError = (ErrorType, String);

impl Notebook {
    fn scan(text: &str) -> Result<Notebook, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|err| format!("invalid JSON: {err}"))?;
        let bytes = text.as_bytes();
        let top = skip_ws(bytes, 0);
        if bytes.get(top) != Some(&b'{') {
            return Err("the top level is not an object".to_owned());
        }
        let members = object_members(text, top)?;
        let cells_member = members
            .iter()
            .find(|member| member.key == "cells")
            .ok_or_else(|| "it has no cells".to_owned())?;
        if bytes.get(cells_member.value.start) != Some(&b'[') {
            return Err("cells is not a list".to_owned());
        }
        let cell_values = value.get("cells").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut cells = Vec::new();
        for (item, cell_value) in
            array_items(text, cells_member.value.start)?.into_iter().zip(cell_values)
        {
            if bytes.get(item.start) != Some(&b'{') {
                return Err("a cell is not an object".to_owned());
            }
            cells.push(CellSpan {
                members: object_members(text, item.start)?,
                span: item,
                value: cell_value,
            });
        }
        let cells_key_column = column(text, cells_member.key_start);
        let unit = if line_of(text, top) == line_of(text, cells_member.key_start) {
            None
        } else {
            Some(cells_key_column.saturating_sub(column(text, top)).max(1))
        };
        let minor = value.get("nbformat_minor").and_then(Value::as_u64).unwrap_or(0);
        let major = value.get("nbformat").and_then(Value::as_u64).unwrap_or(4);
        let uses_ids = cells.iter().any(|cell| cell.id().is_some()) || (major, minor) >= (4, 5);
        Ok(Notebook {
            cells_array: cells_member.value,
            cells_key_column,
            cells,
            unit,
            ascii: text.is_ascii() && text.contains("\\u"),
            uses_ids,
        })
    }

    /// The cell the call names.
    fn find(&self, args: &Args) -> Result<usize, EditError> {
        let not_found = |message: String| (ErrorType::NotFound, message);
        match (&args.cell_id, args.index) {
            (Some(id), index) => {
                let found = self
                    .cells
                    .iter()
                    .position(|cell| cell.id() == Some(id.as_str()))
                    .ok_or_else(|| not_found(format!("no cell has the id {id:?}")))?;
                match index {
                    Some(index) if args.action != EditAction::Insert && index as usize != found => {
                        Err((
                            ErrorType::InvalidArguments,
                            format!("cell {id:?} is at index {found}, not {index}"),
                        ))
                    }
                    _ => Ok(found),
                }
            }
            (None, Some(index)) => {
                let index = usize::try_from(index).unwrap_or(usize::MAX);
                if index < self.cells.len() {
                    Ok(index)
                } else {
                    Err(not_found(format!(
                        "there is no cell {index}; the notebook has {} cells (0-based)",
                        self.cells.len()
                    )))
                }
            }
            (None, None) => Err(not_found("no cell named".to_owned())),
        }
    }

    /// The edit the call asks for, applied to `text`. The edited notebook may be at
    /// most `limit` bytes (the read limit): what is rendered in the notebook's style,
    /// whose indentation is repeated on every line, is refused as soon as it would pass
    /// that, before more of it is built.
    fn edit(&self, text: &str, args: &Args, limit: usize) -> Result<Edited, EditError> {
        let source = args.source.as_deref().unwrap_or_default();
        let too_large = |_: TooLarge| too_large(&args.path, limit);
        match args.action {
            EditAction::Replace => {
                let index = self.find(args)?;
                let cell = &self.cells[index];
                let current_type = cell.value.get("cell_type").and_then(Value::as_str);
                let new_type = args.cell_type.map(CellType::as_str);
                let id = cell.id().map(str::to_owned);
                if new_type.is_some() && new_type != current_type {
                    let metadata =
                        cell.value.get("metadata").cloned().unwrap_or(Value::Object(Map::new()));
                    let mut rendered = Out::new(limit);
                    self.render_cell(
                        &mut rendered,
                        new_type.unwrap_or("code"),
                        id.as_deref(),
                        &metadata,
                        source,
                        column(text, cell.span.start),
                    )
                    .map_err(too_large)?;
                    let text =
                        splice(text, cell.span, &[&rendered.text], limit).map_err(too_large)?;
                    return Ok(Edited { text, index, id, cells: self.cells.len() });
                }
                let Some(member) = cell.member("source") else {
                    return Err((
                        ErrorType::InvalidArguments,
                        format!("cell {index} has no source"),
                    ));
                };
                let current = source_text(cell.value.get("source"));
                if current == source {
                    return Ok(Edited {
                        text: text.to_owned(),
                        index,
                        id,
                        cells: self.cells.len(),
                    });
                }
                let as_string = text.as_bytes().get(member.value.start) == Some(&b'"');
                let mut rendered = Out::new(limit);
                if as_string {
                    rendered.push(&self.string(source)).map_err(too_large)?;
                } else {
                    self.source_array(
                        &mut rendered,
                        source,
                        column(text, member.key_start),
                        self.is_pretty(text, member.value),
                    )
                    .map_err(too_large)?;
                }
                let text =
                    splice(text, member.value, &[&rendered.text], limit).map_err(too_large)?;
                Ok(Edited { text, index, id, cells: self.cells.len() })
            }
            EditAction::Delete => {
                let index = self.find(args)?;
                let cell = &self.cells[index];
                let id = cell.id().map(str::to_owned);
                let remove = if self.cells.len() == 1 {
                    Span { start: self.cells_array.start + 1, end: self.cells_array.end - 1 }
                } else if index > 0 {
                    Span { start: self.cells[index - 1].span.end, end: cell.span.end }
                } else {
                    Span { start: cell.span.start, end: self.cells[1].span.start }
                };
                let text = splice(text, remove, &[], limit).map_err(too_large)?;
                Ok(Edited { text, index, id, cells: self.cells.len() - 1 })
            }
            EditAction::Insert => {
                let index = match (args.index, &args.cell_id) {
                    (Some(index), _) => usize::try_from(index).unwrap_or(usize::MAX),
                    (None, Some(_)) => self.find(args)? + 1,
                    (None, None) => 0,
                };
                if index > self.cells.len() {
                    return Err((
                        ErrorType::NotFound,
                        format!(
                            "cannot insert at {index}; the notebook has {} cells (0-based)",
                            self.cells.len()
                        ),
                    ));
                }
                let id = self.uses_ids.then(|| new_cell_id(&self.cells));
                let cell_type = args.cell_type.map_or("code", CellType::as_str);
                let cell_column = match (self.cells.first(), self.unit) {
                    (Some(cell), _) => column(text, cell.span.start),
                    (None, Some(unit)) => self.cells_key_column + unit,
                    (None, None) => 0,
                };
                let mut rendered = Out::new(limit);
                self.render_cell(
                    &mut rendered,
                    cell_type,
                    id.as_deref(),
                    &Value::Object(Map::new()),
                    source,
                    cell_column,
                )
                .map_err(too_large)?;
                let rendered = rendered.text;
                // Columns of the file: no longer than the file itself.
                let (separator, outer) = match self.unit {
                    Some(_) => (
                        format!(",\n{}", " ".repeat(cell_column)),
                        format!("\n{}", " ".repeat(self.cells_key_column)),
                    ),
                    None => (",".to_owned(), String::new()),
                };
                let text = if self.cells.is_empty() {
                    let opening = match self.unit {
                        Some(_) => format!("[\n{}", " ".repeat(cell_column)),
                        None => "[".to_owned(),
                    };
                    splice(text, self.cells_array, &[&opening, &rendered, &outer, "]"], limit)
                } else if index < self.cells.len() {
                    let at = self.cells[index].span.start;
                    splice(text, Span { start: at, end: at }, &[&rendered, &separator], limit)
                } else {
                    let at = self.cells[self.cells.len() - 1].span.end;
                    splice(text, Span { start: at, end: at }, &[&separator, &rendered], limit)
                };
                let text = text.map_err(too_large)?;
                Ok(Edited { text, index, id, cells: self.cells.len() + 1 })
            }
        }
    }

    /// Whether a value spans several lines (written indented).
    fn is_pretty(&self, text: &str, span: Span) -> bool {
        self.unit.is_some() && text[span.start..span.end].contains('\n')
            || (self.unit.is_some() && &text[span.start..span.end] == "[]")
    }

    /// A source as nbformat writes it: one string per line, each keeping its `\n`.
    fn source_array(
        &self,
        out: &mut Out,
        source: &str,
        key_column: usize,
        pretty: bool,
    ) -> Result<(), TooLarge> {
        let lines = source.split_inclusive('\n');
        if source.is_empty() {
            return out.push("[]");
        }
        let Some(unit) = self.unit.filter(|_| pretty) else {
            out.push("[")?;
            for (idx, line) in lines.enumerate() {
                if idx > 0 {
                    out.push(",")?;
                }
                out.push(&self.string(line))?;
            }
            return out.push("]");
        };
        out.push("[\n")?;
        for (idx, line) in lines.enumerate() {
            if idx > 0 {
                out.push(",\n")?;
            }
            out.spaces(key_column + unit)?;
            out.push(&self.string(line))?;
        }
        out.push("\n")?;
        out.spaces(key_column)?;
        out.push("]")
    }

    /// A whole cell, keys sorted as nbformat writes them.
    fn render_cell(
        &self,
        out: &mut Out,
        cell_type: &str,
        id: Option<&str>,
        metadata: &Value,
        source: &str,
        cell_column: usize,
    ) -> Result<(), TooLarge> {
        let key_column = cell_column + self.unit.unwrap_or(0);
        let mut keys = vec!["cell_type"];
        if cell_type == "code" {
            keys.push("execution_count");
        }
        if id.is_some() {
            keys.push("id");
        }
        keys.push("metadata");
        if cell_type == "code" {
            keys.push("outputs");
        }
        keys.push("source");
        out.push(if self.unit.is_some() { "{\n" } else { "{" })?;
        for (idx, key) in keys.into_iter().enumerate() {
            match (idx, self.unit) {
                (0, Some(_)) => {}
                (_, Some(_)) => out.push(",\n")?,
                (0, None) => {}
                (_, None) => out.push(", ")?,
            }
            if self.unit.is_some() {
                out.spaces(key_column)?;
            }
            out.push("\"")?;
            out.push(key)?;
            out.push("\": ")?;
            match key {
                "cell_type" => out.push(&self.string(cell_type))?,
                "execution_count" => out.push("null")?,
                "id" => out.push(&self.string(id.unwrap_or_default()))?,
                "metadata" => self.pretty(metadata, key_column, out)?,
                "outputs" => out.push("[]")?,
                _ => self.source_array(out, source, key_column, true)?,
            }
        }
        if self.unit.is_some() {
            out.push("\n")?;
            out.spaces(cell_column)?;
        }
        out.push("}")
    }

    /// A value in the notebook's style (Python's `json.dumps(indent=…, sort_keys=True)`).
    fn pretty(&self, value: &Value, column: usize, out: &mut Out) -> Result<(), TooLarge> {
        match value {
            Value::String(text) => out.push(&self.string(text)),
            Value::Array(items) if items.is_empty() => out.push("[]"),
            Value::Object(map) if map.is_empty() => out.push("{}"),
            Value::Array(items) => match self.unit {
                Some(unit) => {
                    out.push("[\n")?;
                    for (idx, item) in items.iter().enumerate() {
                        if idx > 0 {
                            out.push(",\n")?;
                        }
                        out.spaces(column + unit)?;
                        self.pretty(item, column + unit, out)?;
                    }
                    out.push("\n")?;
                    out.spaces(column)?;
                    out.push("]")
                }
                None => out.push(&value.to_string()),
            },
            Value::Object(map) => match self.unit {
                Some(unit) => {
                    out.push("{\n")?;
                    for (idx, (key, item)) in map.iter().enumerate() {
                        if idx > 0 {
                            out.push(",\n")?;
                        }
                        out.spaces(column + unit)?;
                        out.push(&self.string(key))?;
                        out.push(": ")?;
                        self.pretty(item, column + unit, out)?;
                    }
                    out.push("\n")?;
                    out.spaces(column)?;
                    out.push("}")
                }
                None => out.push(&value.to_string()),
            },
            other => out.push(&other.to_string()),
        }
    }

    /// A JSON string, escaped as the file escapes (non-ASCII as `\uXXXX` when it does).
    fn string(&self, text: &str) -> String {
        let plain = serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned());
        if !self.ascii || plain.is_ascii() {
            return plain;
        }
        let mut out = String::with_capacity(plain.len() + 16);
        for ch in plain.chars() {
            if ch.is_ascii() {
                out.push(ch);
            } else {
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
        out
    }
}

/// `text` with `span` replaced by the pieces of `with`; refused, before anything is
/// allocated, when it would be longer than `limit`.
fn splice(text: &str, span: Span, with: &[&str], limit: usize) -> Result<String, TooLarge> {
    let added = with.iter().fold(0usize, |len, piece| len.saturating_add(piece.len()));
    let len = (text.len() - (span.end - span.start)).saturating_add(added);
    if len > limit {
        return Err(TooLarge);
    }
    let mut out = String::with_capacity(len);
    out.push_str(&text[..span.start]);
    for piece in with {
        out.push_str(piece);
    }
    out.push_str(&text[span.end..]);
    Ok(out)
}

/// Text rendered for a notebook, never longer than its limit: a push that would pass
/// it is refused before it is made.
struct Out {
    text: String,
    limit: usize,
}

/// What was to be rendered would pass the limit.
#[derive(Debug)]
struct TooLarge;

impl Out {
    fn new(limit: usize) -> Out {
        Out { text: String::new(), limit }
    }

    fn room(&self, more: usize) -> Result<(), TooLarge> {
        if self.text.len().saturating_add(more) > self.limit {
            return Err(TooLarge);
        }
        Ok(())
    }

    fn push(&mut self, piece: &str) -> Result<(), TooLarge> {
        self.room(piece.len())?;
        self.text.push_str(piece);
        Ok(())
    }

    /// `count` spaces (an indentation).
    fn spaces(&mut self, count: usize) -> Result<(), TooLarge> {
        self.room(count)?;
        self.text.extend(std::iter::repeat_n(' ', count));
        Ok(())
    }
}

/// The refusal of an edit that would make the notebook larger than the read limit.
fn too_large(path: &str, limit: usize) -> EditError {
    (
        ErrorType::TooLarge,
        format!(
            "the edit, written in the notebook's style, would make {} larger than the read \
             limit of {limit} bytes ([limits] max_read_bytes); notebook_edit only writes a \
             notebook it can read back whole; nothing was changed",
            fs::shorten(path)
        ),
    )
}

/// A cell's source as one text (nbformat allows a string or a list of strings).
fn source_text(source: Option<&Value>) -> String {
    match source {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    }
}

fn new_cell_id(cells: &[CellSpan]) -> String {
    loop {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_usize(cells.len());
        let id = format!("{:08x}", hasher.finish() & 0xFFFF_FFFF);
        if !cells.iter().any(|cell| cell.id() == Some(id.as_str())) {
            return id;
        }
    }
}

fn column(text: &str, at: usize) -> usize {
    let line_start = text[..at].rfind('\n').map_or(0, |idx| idx + 1);
    at - line_start
}

fn line_of(text: &str, at: usize) -> usize {
    memchr::memchr_iter(b'\n', &text.as_bytes()[..at]).count()
}

fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|byte| matches!(byte, b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// The end (exclusive) of the string starting at `at` (its opening quote).
fn string_end(bytes: &[u8], at: usize) -> Result<usize, String> {
    let mut idx = at + 1;
    while idx < bytes.len() {
        match bytes[idx] {
            b'\\' => idx += 2,
            b'"' => return Ok(idx + 1),
            _ => idx += 1,
        }
    }
    Err("an unterminated string".to_owned())
}

/// The end (exclusive) of the JSON value starting at `at`.
fn value_end(bytes: &[u8], at: usize) -> Result<usize, String> {
    match bytes.get(at) {
        Some(b'"') => string_end(bytes, at),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut idx = at;
            while idx < bytes.len() {
                match bytes[idx] {
                    b'"' => {
                        idx = string_end(bytes, idx)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(idx + 1);
                        }
                    }
                    _ => {}
                }
                idx += 1;
            }
            Err("an unterminated object or list".to_owned())
        }
        Some(_) => {
            let mut idx = at;
            while bytes.get(idx).is_some_and(|byte| {
                !matches!(byte, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
            }) {
                idx += 1;
            }
            Ok(idx)
        }
        None => Err("the text ends early".to_owned()),
    }
}

fn object_members(text: &str, at: usize) -> Result<Vec<Member>, String> {
    let bytes = text.as_bytes();
    let mut members = Vec::new();
    let mut idx = skip_ws(bytes, at + 1);
    if bytes.get(idx) == Some(&b'}') {
        return Ok(members);
    }
    loop {
        if bytes.get(idx) != Some(&b'"') {
            return Err("an object key is not a string".to_owned());
        }
        let key_end = string_end(bytes, idx)?;
        let key: String =
            serde_json::from_str(&text[idx..key_end]).map_err(|err| err.to_string())?;
        let colon = skip_ws(bytes, key_end);
        if bytes.get(colon) != Some(&b':') {
            return Err("a key without a colon".to_owned());
        }
        let start = skip_ws(bytes, colon + 1);
        let end = value_end(bytes, start)?;
        members.push(Member { key, key_start: idx, value: Span { start, end } });
        idx = skip_ws(bytes, end);
        match bytes.get(idx) {
            Some(b',') => idx = skip_ws(bytes, idx + 1),
            Some(b'}') => return Ok(members),
            _ => return Err("an object is not closed".to_owned()),
        }
    }
}

fn array_items(text: &str, at: usize) -> Result<Vec<Span>, String> {
    let bytes = text.as_bytes();
    let mut items = Vec::new();
    let mut idx = skip_ws(bytes, at + 1);
    if bytes.get(idx) == Some(&b']') {
        return Ok(items);
    }
    loop {
        let end = value_end(bytes, idx)?;
        items.push(Span { start: idx, end });
        idx = skip_ws(bytes, end);
        match bytes.get(idx) {
            Some(b',') => idx = skip_ws(bytes, idx + 1),
            Some(b']') => return Ok(items),
            _ => return Err("a list is not closed".to_owned()),
        }
    }
}

// ---------------------------------------------------------------------------------
// Rendering for read_file.

/// A notebook as text for the model: numbered cells (0-based, as notebook_edit takes
/// them) with their ids, sources and text outputs; image outputs become attachments.
/// `None` when the bytes are not a notebook.
pub(crate) fn render(bytes: &[u8]) -> Option<(String, Vec<Attachment>, usize)> {
    let value: Value = serde_json::from_slice(bytes).ok()?;
    let cells = value.get("cells")?.as_array()?;
    let language = value
        .pointer("/metadata/kernelspec/language")
        .or_else(|| value.pointer("/metadata/language_info/name"))
        .and_then(Value::as_str)
        .unwrap_or("python");
    let mut out = String::new();
    let mut attachments = Vec::new();
    for (index, cell) in cells.iter().enumerate() {
        let cell_type = cell.get("cell_type").and_then(Value::as_str).unwrap_or("code");
        let _ = write!(out, "[cell {index}] {cell_type}");
        if let Some(id) = cell.get("id").and_then(Value::as_str) {
            let _ = write!(out, " id={id}");
        }
        if cell_type == "code" {
            let _ = write!(out, " ({language})");
            if let Some(count) = cell.get("execution_count").and_then(Value::as_u64) {
                let _ = write!(out, " execution_count={count}");
            }
        }
        out.push('\n');
        let source = source_text(cell.get("source"));
        out.push_str(&source);
        if !source.is_empty() && !source.ends_with('\n') {
            out.push('\n');
        }
        let outputs =
            cell.get("outputs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        for (number, output) in outputs.iter().enumerate() {
            render_output(number, output, &mut out, &mut attachments);
        }
        out.push('\n');
    }
    Some((out, attachments, cells.len()))
}

fn render_output(
    number: usize,
    output: &Value,
    out: &mut String,
    attachments: &mut Vec<Attachment>,
) {
    let kind = output.get("output_type").and_then(Value::as_str).unwrap_or("output");
    let text = match kind {
        "stream" => source_text(output.get("text")),
        "error" => {
            let name = output.get("ename").and_then(Value::as_str).unwrap_or("Error");
            let value = output.get("evalue").and_then(Value::as_str).unwrap_or_default();
            let traceback: Vec<String> = output
                .get("traceback")
                .and_then(Value::as_array)
                .map(|lines| lines.iter().filter_map(Value::as_str).map(strip_ansi).collect())
                .unwrap_or_default();
            format!("{name}: {value}\n{}", traceback.join("\n"))
        }
        _ => {
            let data = output.get("data");
            for mime in ["image/png", "image/jpeg", "image/gif", "image/webp"] {
                if let Some(image) = data.and_then(|data| data.get(mime)) {
                    let encoded: String =
                        source_text(Some(image)).chars().filter(|ch| !ch.is_whitespace()).collect();
                    attachments
                        .push(Attachment::Image { mime_type: mime.to_owned(), data: encoded });
                    let _ = writeln!(
                        out,
                        "[output {number}] {mime} (image attachment {})",
                        attachments.len()
                    );
                }
            }
            data.and_then(|data| data.get("text/plain"))
                .map(|text| source_text(Some(text)))
                .unwrap_or_default()
        }
    };
    if text.is_empty() {
        return;
    }
    let _ = writeln!(out, "[output {number}] {kind}");
    match text.char_indices().nth(MAX_OUTPUT_CHARS) {
        Some((at, _)) => {
            out.push_str(&text[..at]);
            let _ = writeln!(out, "… [output cut: {} more characters]", text[at..].chars().count());
        }
        None => {
            out.push_str(&text);
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
    }
}

/// Tracebacks carry terminal colours; the model needs the text.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for next in chars.by_ref() {
                if next.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTEBOOK: &str = r##"{
 "cells": [
  {
   "cell_type": "markdown",
   "id": "a1",
   "metadata": {},
   "source": [
    "# Title\n",
    "Some text"
   ]
  },
  {
   "cell_type": "code",
   "execution_count": 1,
   "id": "b2",
   "metadata": {
    "tags": [
     "x"
    ]
   },
   "outputs": [
    {
     "name": "stdout",
     "output_type": "stream",
     "text": [
      "hi\n"
     ]
    }
   ],
   "source": [
    "print(\"hi\")"
   ]
  }
 ],
 "metadata": {
  "kernelspec": {
   "language": "python",
   "name": "python3"
  }
 },
 "nbformat": 4,
 "nbformat_minor": 5
}
"##;

    const MIB: usize = 1024 * 1024;

    fn args(
        action: EditAction,
        index: Option<u64>,
        source: Option<&str>,
        cell_type: Option<CellType>,
    ) -> Args {
        Args {
            path: "n.ipynb".into(),
            cell_id: None,
            index,
            action,
            source: source.map(str::to_owned),
            cell_type,
        }
    }

    #[test]
    fn replacing_with_the_same_text_keeps_every_byte() {
        let notebook = Notebook::scan(NOTEBOOK).unwrap();
        for (index, source) in [(0, "# Title\nSome text"), (1, "print(\"hi\")")] {
            let edited = notebook
                .edit(NOTEBOOK, &args(EditAction::Replace, Some(index), Some(source), None), MIB)
                .unwrap();
            assert_eq!(edited.text, NOTEBOOK);
        }
    }

    #[test]
    fn edits_change_only_their_span_in_the_notebooks_style() {
        let notebook = Notebook::scan(NOTEBOOK).unwrap();
        let edited = notebook
            .edit(
                NOTEBOOK,
                &args(EditAction::Replace, Some(1), Some("x = 1\nprint(x)\n"), None),
                MIB,
            )
            .unwrap();
        assert!(
            edited
                .text
                .contains("   \"source\": [\n    \"x = 1\\n\",\n    \"print(x)\\n\"\n   ]\n  }"),
            "{}",
            edited.text
        );
        // Metadata and outputs untouched.
        assert!(edited.text.contains("    \"tags\": [\n     \"x\"\n    ]"));

        let inserted = notebook
            .edit(
                NOTEBOOK,
                &args(EditAction::Insert, Some(1), Some("## Part"), Some(CellType::Markdown)),
                MIB,
            )
            .unwrap();
        let parsed: Value = serde_json::from_str(&inserted.text).unwrap();
        assert_eq!(parsed["cells"].as_array().unwrap().len(), 3);
        assert_eq!(parsed["cells"][1]["source"], serde_json::json!(["## Part"]));
        assert!(inserted.id.is_some());
        // Deleting it again gives back the original bytes.
        let again = Notebook::scan(&inserted.text).unwrap();
        let deleted = again
            .edit(&inserted.text, &args(EditAction::Delete, Some(1), None, None), MIB)
            .unwrap();
        assert_eq!(deleted.text, NOTEBOOK);
    }

    #[test]
    fn an_edit_is_refused_as_soon_as_the_notebook_would_pass_the_limit() {
        let notebook = Notebook::scan(NOTEBOOK).unwrap();
        let source = "x = 1\n".repeat(100);
        let replace = args(EditAction::Replace, Some(1), Some(&source), None);
        let edited = notebook.edit(NOTEBOOK, &replace, MIB).unwrap();
        let len = edited.text.len();
        // The limit is the edited notebook's size: one byte less refuses it.
        assert_eq!(notebook.edit(NOTEBOOK, &replace, len).unwrap().text, edited.text);
        let (error_type, message) = notebook.edit(NOTEBOOK, &replace, len - 1).err().unwrap();
        assert_eq!(error_type, ErrorType::TooLarge);
        assert!(message.contains(&format!("read limit of {} bytes", len - 1)), "{message}");
        // A rendering longer than the limit by itself stops part way.
        let mut out = Out::new(100);
        let refused = notebook.source_array(&mut out, &source, 2, true);
        assert!(refused.is_err() && out.text.len() <= 100, "{}", out.text.len());
        for action in [EditAction::Insert, EditAction::Delete] {
            let call = args(action, Some(1), Some(&source), Some(CellType::Code));
            let edited = notebook.edit(NOTEBOOK, &call, MIB).unwrap();
            let len = edited.text.len();
            assert!(notebook.edit(NOTEBOOK, &call, len).is_ok(), "{action:?}");
            let refused = notebook.edit(NOTEBOOK, &call, len - 1).err();
            assert_eq!(refused.map(|(error_type, _)| error_type), Some(ErrorType::TooLarge));
        }
        // A type change renders the cell's metadata in the notebook's style too.
        let retype = args(EditAction::Replace, Some(1), Some("x"), Some(CellType::Markdown));
        let edited = notebook.edit(NOTEBOOK, &retype, MIB).unwrap();
        let cell = "  {\n   \"cell_type\": \"markdown\",\n   \"id\": \"b2\",\n   \"metadata\": {\n    \
                    \"tags\": [\n     \"x\"\n    ]\n   },\n   \"source\": [\n    \"x\"\n   ]\n  }\n ],";
        assert!(edited.text.contains(cell), "{}", edited.text);
        assert!(notebook.edit(NOTEBOOK, &retype, edited.text.len() - 1).is_err());
    }

    #[test]
    fn renders_numbered_cells_with_outputs() {
        let (text, attachments, cells) = render(NOTEBOOK.as_bytes()).unwrap();
        assert_eq!(cells, 2);
        assert!(attachments.is_empty());
        assert!(text.starts_with("[cell 0] markdown id=a1\n# Title\nSome text\n"), "{text}");
        assert!(text.contains("[cell 1] code id=b2 (python) execution_count=1\nprint(\"hi\")\n[output 0] stream\nhi\n"), "{text}");
    }
}
