//! Giving memory back to the system after a large request.
//!
//! glibc's allocator keeps what a large request freed in its arenas (and raises its
//! thresholds after a large free), so a daemon that served one 15 MB request would
//! otherwise stay that large. After a connection frees a large buffer or ends,
//! [`release_soon`] asks for `malloc_trim`, which hands every free page of every arena
//! back. Requests are gathered: at most one trim runs per [`GATHER`], off the hot path.
//!
//! The call into the C library is `sys::trim_heap`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

/// How long requests gather before one trim.
const GATHER: Duration = Duration::from_millis(100);

static TRIMMER: OnceLock<Arc<Notify>> = OnceLock::new();

/// Asks for freed memory to go back to the system shortly (on the runtime this is
/// called from; outside a runtime, nothing happens).
pub fn release_soon() {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let wake = TRIMMER.get_or_init(|| {
        let wake = Arc::new(Notify::new());
        let woken = wake.clone();
        runtime.spawn(async move {
            loop {
                woken.notified().await;
                tokio::time::sleep(GATHER).await;
                trim();
            }
        });
        wake
    });
    wake.notify_one();
}

/// Calls [`release_soon`] when dropped.
pub struct ReleaseOnDrop;

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        release_soon();
    }
}

fn trim() {
    crate::sys::trim_heap();
}
