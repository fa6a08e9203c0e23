//! KDA kernel cases (to be written).
