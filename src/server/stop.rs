//! Stop sequences over streamed text: text is released as soon as it cannot be the start of a
//! stop string; a match ends generation and the stop string itself is not returned.

pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Add text; returns the text now safe to emit and whether a stop string was found (then
    /// the returned text is everything before it, and the matcher should not be used again).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(i) = first {
            let out = self.held[..i].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&k| {
                        self.held.is_char_boundary(self.held.len() - k)
                            && s.starts_with(&self.held[self.held.len() - k..])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let out: String = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..out.len());
        (out, false)
    }

    /// End of generation: the held-back text (it did not become a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_stops_across_pieces() {
        let mut m = StopMatcher::new(vec!["END".into(), "xyz".into()]);
        assert_eq!(m.push("hello E"), ("hello ".into(), false));
        assert_eq!(m.push("N"), (String::new(), false));
        assert_eq!(m.push("D and more"), (String::new(), true));

        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("a EN"), ("a ".into(), false));
        assert_eq!(m.push("x"), ("ENx".into(), false));
        assert_eq!(m.push("E"), (String::new(), false));
        assert_eq!(m.finish(), "E");
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_is_safe() {
        let mut m = StopMatcher::new(vec!["bc".into(), "ab".into()]);
        assert_eq!(m.push("xabc"), ("x".into(), true));
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.push("café"), ("caf".into(), false));
        assert_eq!(m.push("?"), ("é?".into(), false));
    }
}
