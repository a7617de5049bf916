//! SKELETON: replaced by the real tool.
use std::sync::Arc;

use crate::tools::{Safety, Tool};

pub fn tool() -> Arc<dyn Tool> {
    super::placeholder("read_file", Safety::ReadOnly)
}
