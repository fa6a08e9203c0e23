pub const CORPUS: &[&str] = &[];
