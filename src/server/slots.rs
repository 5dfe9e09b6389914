//! Per-client fairness: a cap on the requests one API key has in flight (queued, running, or
//! still streaming), so that one client cannot take every queue place and starve the others.
//! A request holds its slot from authentication until its response ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use super::error::ApiError;

pub struct ClientSlots {
    /// At most this many requests in flight per client; 0 = no cap.
    cap: usize,
    in_flight: Mutex<HashMap<Arc<str>, usize>>,
}

/// One request's place; gives it back when dropped.
pub struct Slot {
    slots: Arc<ClientSlots>,
    client: Arc<str>,
}

impl ClientSlots {
    pub fn new(cap: usize) -> ClientSlots {
        ClientSlots {
            cap,
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Take a place for `client`, or a 429 when it has `cap` requests in flight already.
    pub fn acquire(self: &Arc<Self>, client: &Arc<str>) -> Result<Slot, ApiError> {
        let mut map = self
            .in_flight
            .lock()
            .map_err(|_| ApiError::server("the request table is unavailable"))?;
        let n = map.entry(Arc::clone(client)).or_insert(0);
        if self.cap > 0 && *n >= self.cap {
            return Err(ApiError::invalid(
                format!(
                    "this API key has {} requests in flight, the most the server allows per key; \
                     wait for one to finish",
                    self.cap
                ),
                None,
            )
            .with_status(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error")
            .with_code("too_many_requests"));
        }
        *n += 1;
        Ok(Slot {
            slots: Arc::clone(self),
            client: Arc::clone(client),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut map) = self.slots.in_flight.lock() {
            if let Some(n) = map.get_mut(&self.client) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&self.client);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_per_client_and_release_on_drop() {
        let slots = Arc::new(ClientSlots::new(2));
        let (a, b): (Arc<str>, Arc<str>) = ("alice".into(), "bob".into());
        let a1 = slots.acquire(&a).unwrap();
        let _a2 = slots.acquire(&a).unwrap();
        assert!(slots.acquire(&a).is_err());
        let _b1 = slots.acquire(&b).unwrap();
        drop(a1);
        let _a3 = slots.acquire(&a).unwrap();
        let open = Arc::new(ClientSlots::new(0));
        let held: Vec<_> = (0..100).map(|_| open.acquire(&a).unwrap()).collect();
        assert_eq!(held.len(), 100);
    }
}
