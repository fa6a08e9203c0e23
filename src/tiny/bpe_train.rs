// TEMPORARY STUB (helper-2 will replace this file)
pub fn train_bpe(_corpus: &[&str], _n_merges: usize) -> Vec<(String, String)> { Vec::new() }
pub fn build_vocab(_merges: &[(String, String)], specials: &[(&str, i32)]) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = (0..256u32).map(|b| char::from_u32(0x100 + b).unwrap().to_string()).collect();
    let mut types = vec![1; 256];
    for (s, t) in specials { tokens.push(s.to_string()); types.push(*t); }
    (tokens, types, Vec::new())
}
