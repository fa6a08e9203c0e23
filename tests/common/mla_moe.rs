//! MLA and MoE kernel cases (to be written).
