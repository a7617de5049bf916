//! Named sessions: a session a client opens under a name (`session/open {name}`) that
//! outlives the connection, so that a shell's successive commands share what a session
//! remembers (files read, grants "for this session"). The table maps (client identity,
//! name) to a session id. When the owning connection goes, the session is parked, not
//! closed: its calls end with the connection, and it waits, idle, for the same identity
//! to open the same name again, at most [`NAMED_SESSION_IDLE`]. Expired sessions are
//! closed the next time any session is opened or any connection ends.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a parked named session waits for its client to come back.
pub const NAMED_SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// Named sessions one client identity may hold at once.
pub const MAX_NAMED_SESSIONS: usize = 64;

#[derive(Debug)]
pub(crate) struct NamedSessions {
    slots: HashMap<(String, String), Slot>,
    pub(crate) idle: Duration,
}

#[derive(Debug)]
struct Slot {
    id: String,
    /// Set while no connection owns the session: when it expires.
    parked_until: Option<Instant>,
}

impl Default for NamedSessions {
    fn default() -> NamedSessions {
        NamedSessions { slots: HashMap::new(), idle: NAMED_SESSION_IDLE }
    }
}

impl NamedSessions {
    /// The session id under this name, when one is kept and has not expired; it is
    /// owned again from now on.
    pub(crate) fn claim(&mut self, client: &str, name: &str, now: Instant) -> Option<String> {
        let key = (client.to_owned(), name.to_owned());
        let slot = self.slots.get_mut(&key)?;
        if slot.parked_until.is_some_and(|until| until <= now) {
            return None;
        }
        slot.parked_until = None;
        Some(slot.id.clone())
    }

    /// How many names a client holds.
    pub(crate) fn count(&self, client: &str) -> usize {
        self.slots.keys().filter(|(owner, _)| owner == client).count()
    }

    pub(crate) fn insert(&mut self, client: &str, name: &str, id: String) {
        self.slots.insert((client.to_owned(), name.to_owned()), Slot { id, parked_until: None });
    }

    /// Parks a session whose connection went; false when the session has no name.
    pub(crate) fn park(&mut self, id: &str, now: Instant) -> bool {
        let idle = self.idle;
        match self.slots.values_mut().find(|slot| slot.id == id) {
            Some(slot) => {
                slot.parked_until = Some(now + idle);
                true
            }
            None => false,
        }
    }

    /// Marks a session owned again (re-attached by its resume token).
    pub(crate) fn unpark(&mut self, id: &str) {
        if let Some(slot) = self.slots.values_mut().find(|slot| slot.id == id) {
            slot.parked_until = None;
        }
    }

    /// Forgets a session (closed by its client).
    pub(crate) fn forget(&mut self, id: &str) {
        self.slots.retain(|_, slot| slot.id != id);
    }

    /// Removes the names whose wait is over (and those `claim` found expired), and
    /// returns their session ids, to be closed.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<String> {
        let mut expired = Vec::new();
        self.slots.retain(|_, slot| {
            let keep = slot.parked_until.is_none_or(|until| until > now);
            if !keep {
                expired.push(slot.id.clone());
            }
            keep
        });
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parked_session_is_found_again_until_it_expires() {
        let mut table = NamedSessions { idle: Duration::from_secs(10), ..Default::default() };
        let start = Instant::now();
        table.insert("uid:1000", "work", "s1".to_owned());
        assert_eq!(table.claim("uid:1000", "work", start).as_deref(), Some("s1"));
        // Another identity never sees it.
        assert_eq!(table.claim("uid:1001", "work", start), None);

        assert!(table.park("s1", start));
        assert!(!table.park("s2", start), "an unnamed session is not parked");
        assert!(table.expire(start + Duration::from_secs(9)).is_empty());
        assert_eq!(
            table.claim("uid:1000", "work", start + Duration::from_secs(9)).as_deref(),
            Some("s1")
        );

        // Claimed again: no longer parked, so it never expires while owned.
        assert!(table.expire(start + Duration::from_secs(3600)).is_empty());
        assert!(table.park("s1", start));
        assert_eq!(table.claim("uid:1000", "work", start + Duration::from_secs(10)), None);
        assert_eq!(table.expire(start + Duration::from_secs(10)), vec!["s1".to_owned()]);
        assert_eq!(table.count("uid:1000"), 0);
    }

    #[test]
    fn a_closed_session_loses_its_name() {
        let mut table = NamedSessions::default();
        table.insert("uid:1000", "a", "s1".to_owned());
        table.insert("uid:1000", "b", "s2".to_owned());
        assert_eq!(table.count("uid:1000"), 2);
        table.forget("s1");
        assert_eq!(table.count("uid:1000"), 1);
        assert_eq!(table.claim("uid:1000", "a", Instant::now()), None);
    }
}
