//! The built-in tools, one file each: the argument struct, the Definition and the
//! execution. Shared mechanics live in `tools::fs` (confinement, atomic writes) and
//! `exec` (spawning and killing process trees).

use std::sync::Arc;

use super::Tool;

pub mod apply_patch;
pub mod edit_file;
pub mod find_files;
pub mod notebook_edit;
pub mod process_tools;
pub mod read_file;
pub mod run_command;
pub mod search_code;
pub mod write_file;

/// Every built-in tool, in no particular order (the registry sorts).
pub fn all() -> Vec<Arc<dyn Tool>> {
    let mut tools = vec![
        read_file::tool(),
        write_file::tool(),
        edit_file::tool(),
        apply_patch::tool(),
        notebook_edit::tool(),
        run_command::tool(),
        find_files::tool(),
        search_code::tool(),
    ];
    tools.extend(process_tools::tools());
    tools
}
