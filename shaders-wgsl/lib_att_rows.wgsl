// How attention_rows_split.wgsl cuts a row's keys 0..n_keys into pieces, and how many of them
// attention_rows_combine.wgsl merges. The dispatch has ATT_SPLITS pieces per row whatever the
// rows' positions (a recorded step stays valid as they change); a row's keys go into pieces of
// whole tiles of ATT_WG keys, as few as ATT_SPLITS allows: a short row keeps its tiles full in
// a few workgroups and the rest return at once, a long one spreads over all ATT_SPLITS.
fn rows_chunk(n_keys: u32) -> u32 {
    let per = (n_keys + ATT_SPLITS - 1u) / ATT_SPLITS;
    return ((per + ATT_WG - 1u) / ATT_WG) * ATT_WG;
}

// The pieces that hold keys (at most ATT_SPLITS: a chunk holds at least n_keys / ATT_SPLITS).
fn rows_parts(n_keys: u32) -> u32 {
    let chunk = rows_chunk(n_keys);
    return (n_keys + chunk - 1u) / chunk;
}
