//! Root confinement and file bookkeeping shared by the file tools.
//!
//! SKELETON: the confinement functions are filled in by the file-tools work.

use std::path::PathBuf;
use std::time::SystemTime;

use dashmap::DashMap;

use super::ErrorType;

/// Why a path operation failed, mapped onto the stable error codes.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("access denied: {0}")]
    AccessDenied(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0} is a directory")]
    IsDirectory(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    InvalidPath(String),
    #[error("i/o error on {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

impl FsError {
    pub fn error_type(&self) -> ErrorType {
        match self {
            FsError::AccessDenied(_) => ErrorType::AccessDenied,
            FsError::NotFound(_) => ErrorType::NotFound,
            FsError::IsDirectory(_) => ErrorType::IsDirectory,
            FsError::TooLarge(_) => ErrorType::TooLarge,
            FsError::InvalidPath(_) => ErrorType::InvalidArguments,
            FsError::Io { .. } => ErrorType::IoError,
        }
    }
}

/// What the session knew of a file when it last read or wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub modified: Option<SystemTime>,
    pub len: u64,
}

/// Per-session record of the files it has read (or written), keyed by the absolute
/// path inside the roots; write_file and edit_file compare against it.
#[derive(Debug, Default)]
pub struct FileTracker {
    seen: DashMap<PathBuf, FileStamp>,
}

impl FileTracker {
    pub fn record(&self, path: PathBuf, stamp: FileStamp) {
        self.seen.insert(path, stamp);
    }

    pub fn get(&self, path: &std::path::Path) -> Option<FileStamp> {
        self.seen.get(path).map(|entry| entry.value().clone())
    }
}
