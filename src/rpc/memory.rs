//! Giving memory back to the system after a large request.
//!
//! glibc's allocator keeps what a large request freed in its arenas, so a daemon that
//! served one 15 MB request would otherwise stay that large. `main` first fixes the
//! allocator's thresholds (`sys::give_large_blocks_back`: blocks of 1 MiB and more are
//! mapped on their own and unmapped when freed; glibc would otherwise raise the
//! thresholds after the first large free, and a thread's arena would keep the freed
//! block at its top, where no trim reaches). After a connection frees a large buffer
//! or ends, [`release_soon`] asks for `malloc_trim`, which hands the free pages inside
//! every arena back. Requests are gathered: at most one trim runs per [`GATHER`], off
//! the hot path.
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
                crate::sys::trim_heap();
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
