//! Which layout each event's samples have: every event of a recording
//! writes into the same ring buffers, and a sample names its event by its
//! first field (`PERF_SAMPLE_IDENTIFIER`).

use super::attr::{Role, SAMPLE_ID_BITS};
use super::parse::Layout;
use std::collections::HashMap;

/// The layouts of every event of a recording: samples are parsed by the
/// event they come from, which their first field
/// (`PERF_SAMPLE_IDENTIFIER`) names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layouts {
    /// Per event id (from `PERF_EVENT_IOC_ID`; inherited copies write
    /// their parent's id).
    by_id: HashMap<u64, (Role, Layout)>,
    /// When set, every sample has this layout whatever its id.
    single: Option<(Role, Layout)>,
    /// The `sample_id` trailer of non-sample records.
    trailer: Layout,
}

impl Layouts {
    /// Events whose samples all start with `PERF_SAMPLE_IDENTIFIER` and
    /// whose `sample_id` fields are [`SAMPLE_ID_BITS`]; add them with
    /// [`insert`](Self::insert).
    pub fn new() -> Layouts {
        Layouts {
            by_id: HashMap::new(),
            single: None,
            trailer: Layout {
                sample_type: SAMPLE_ID_BITS,
                user_regs: 0,
            },
        }
    }

    /// One event only: every record has `layout`.
    pub fn single(role: Role, layout: Layout) -> Layouts {
        Layouts {
            by_id: HashMap::new(),
            single: Some((role, layout)),
            trailer: layout,
        }
    }

    /// The event with id `id` has `role` and `layout`.
    pub fn insert(&mut self, id: u64, role: Role, layout: Layout) {
        self.by_id.insert(id, (role, layout));
    }

    /// The role and layout of a sample record (header included).
    pub fn of_sample(&self, record: &[u8]) -> Option<(Role, &Layout)> {
        if let Some((role, layout)) = &self.single {
            return Some((*role, layout));
        }
        let id = u64::from_ne_bytes(record.get(8..16)?.try_into().ok()?);
        self.by_id.get(&id).map(|(role, layout)| (*role, layout))
    }

    /// The layout of non-sample records' `sample_id` trailers.
    pub fn trailer(&self) -> &Layout {
        &self.trailer
    }
}
