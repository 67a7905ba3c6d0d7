/// Splits `data` the way a socket might deliver it: the first byte sets the chunk length
/// (0: everything at once), so the fuzzer explores every split point.
pub fn chunks(data: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let Some((&len, rest)) = data.split_first() else {
        return (Vec::new(), data);
    };
    let pieces = match len {
        0 => vec![rest],
        n => rest.chunks(usize::from(n)).collect(),
    };
    (pieces, rest)
}
