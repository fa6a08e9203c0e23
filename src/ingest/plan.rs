//! Units of work: runs of `unit_bytes` of one part file, in file order. A unit is fetched in one request,
//! journaled once its bytes are durable, and hashed when every unit before it has been.

use crate::store::StoreLayout;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub part: usize,
    pub start: u64,
    pub len: u64,
}

impl Unit {
    /// Whether this unit holds the last bytes of its part.
    pub fn ends_part(&self, layout: &StoreLayout) -> bool {
        self.start + self.len == layout.part_lens[self.part]
    }
}

/// Every part cut into units of `unit_bytes` (the last of each part shorter), part after part.
pub fn plan_units(layout: &StoreLayout, unit_bytes: u64) -> Vec<Unit> {
    let mut units = Vec::new();
    for (part, &len) in layout.part_lens.iter().enumerate() {
        let mut start = 0;
        while start < len {
            let n = unit_bytes.min(len - start);
            units.push(Unit { part, start, len: n });
            start += n;
        }
    }
    units
}
