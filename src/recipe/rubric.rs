//! A judge's rubrics as data: a TOML file (`proxy-config/rubrics/swe.toml`
//! is the shipped one, built in as `swe`) naming each rubric's key, name,
//! weight and description, and the judge's instructions. The answer asked
//! for is `{"reasoning": "...", "scores": {"<key>": x, ...}}`, every score
//! on {0.0, 0.1, …, 1.0}; J is the weighted mean, clipped to [0, 1].

use super::RecipeError;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

/// The built-in rubric files, by name.
const BUILT_IN: &[(&str, &str)] = &[("swe", include_str!("../../proxy-config/rubrics/swe.toml"))];

/// One rubric.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dimension {
    pub key: String,
    pub name: String,
    pub weight: f64,
    pub description: String,
}

/// A rubric file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rubric {
    pub name: String,
    pub instructions: String,
    pub rubrics: Vec<Dimension>,
    /// Where it was read from (`built-in:swe` or the path), and the
    /// SHA-256 of its bytes.
    #[serde(skip)]
    pub source: String,
    #[serde(skip)]
    pub sha256: String,
}

/// A judge's answer as JSON: the whole answer, a Markdown code fence
/// around it taken off.
pub fn json_answer(answer: &str) -> Result<Value, String> {
    let t = answer.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .and_then(|t| t.trim_end().strip_suffix("```"))
        .unwrap_or(t)
        .trim();
    serde_json::from_str(t).map_err(|e| format!("not a JSON object: {e}"))
}

/// A judge's parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub reasoning: String,
    /// Per rubric key, snapped to the 0.1 grid.
    pub scores: BTreeMap<String, f64>,
    pub j: f64,
    /// `judge --steps`: each step's retrospective value, and the first
    /// critical mistake the judge named (1-based).
    pub step_values: Vec<f64>,
    pub first_mistake: Option<usize>,
}

impl Rubric {
    /// `swe` (built in) or a TOML file's path.
    pub fn load(name_or_path: &str) -> Result<Rubric, RecipeError> {
        let (source, text) = match BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            Some((n, t)) => (format!("built-in:{n}"), (*t).to_owned()),
            None => {
                let p = Path::new(name_or_path);
                let t =
                    std::fs::read_to_string(p).map_err(|e| RecipeError::Arg {
                        what: "--rubric".into(),
                        why: format!(
                        "{name_or_path} is neither a built-in rubric ({}) nor a readable file: {e}",
                        BUILT_IN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                    ),
                    })?;
                (p.display().to_string(), t)
            }
        };
        Rubric::parse(&text, source)
    }

    pub fn parse(text: &str, source: String) -> Result<Rubric, RecipeError> {
        let bad = |why: String| RecipeError::Arg {
            what: format!("rubric {source}"),
            why,
        };
        let mut r: Rubric = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if r.rubrics.is_empty() {
            return Err(bad("it has no [[rubrics]]".into()));
        }
        let mut keys = std::collections::BTreeSet::new();
        for d in &r.rubrics {
            if !(d.weight.is_finite() && d.weight > 0.0) {
                return Err(bad(format!(
                    "rubric {} has weight {}, not > 0",
                    d.key, d.weight
                )));
            }
            if !keys.insert(d.key.as_str()) {
                return Err(bad(format!("rubric key {} is given twice", d.key)));
            }
        }
        r.sha256 = format!("{:x}", Sha256::digest(text.as_bytes()));
        r.source = source;
        Ok(r)
    }

    /// The system prompt: the instructions, the rubrics, the answer's form.
    pub fn system_prompt(&self) -> String {
        let mut s = self.instructions.trim().to_owned();
        s.push_str("\n\nRubrics:\n");
        for d in &self.rubrics {
            s.push_str(&format!("- {} ({}): {}\n", d.key, d.name, d.description));
        }
        let keys: Vec<String> = self
            .rubrics
            .iter()
            .map(|d| format!("\"{}\": <score>", d.key))
            .collect();
        s.push_str(&format!(
            "\nAnswer with one JSON object and nothing else: {{\"reasoning\": \"<at most three \
             short sentences>\", \"scores\": {{{}}}}}, each score one of 0.0, 0.1, ..., 1.0.",
            keys.join(", ")
        ));
        s
    }

    /// Read a judge's answer strictly: one JSON object (a Markdown code
    /// fence around it is taken off), a `reasoning` string and a `scores`
    /// object with a number in [0, 1] for every rubric key and no other.
    pub fn verdict(&self, answer: &str) -> Result<Verdict, String> {
        let v = json_answer(answer)?;
        let reasoning = v
            .get("reasoning")
            .and_then(Value::as_str)
            .ok_or("no `reasoning` string")?
            .to_owned();
        let scores = v
            .get("scores")
            .and_then(Value::as_object)
            .ok_or("no `scores` object")?;
        if let Some(k) = scores
            .keys()
            .find(|k| !self.rubrics.iter().any(|d| &d.key == *k))
        {
            return Err(format!("`scores` has {k}, which is not a rubric"));
        }
        let mut out = BTreeMap::new();
        let (mut sum, mut weights) = (0.0, 0.0);
        for d in &self.rubrics {
            let x = scores
                .get(&d.key)
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("`scores` has no number for {}", d.key))?;
            if !(0.0..=1.0).contains(&x) {
                return Err(format!("{} = {x} is outside [0, 1]", d.key));
            }
            let x = (x * 10.0).round() / 10.0;
            sum += d.weight * x;
            weights += d.weight;
            out.insert(d.key.clone(), x);
        }
        Ok(Verdict {
            reasoning,
            scores: out,
            j: (sum / weights).clamp(0.0, 1.0),
            step_values: vec![],
            first_mistake: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_swe_rubric_has_orchards_weights() {
        let r = Rubric::load("swe").expect("built in");
        let w: Vec<(&str, f64)> = r
            .rubrics
            .iter()
            .map(|d| (d.name.as_str(), d.weight))
            .collect();
        assert_eq!(
            w,
            vec![
                ("fix_quality", 0.15),
                ("self_test_relevance", 0.18),
                ("coverage", 0.12),
                ("rigor", 0.15),
                ("discriminativeness", 0.14),
                ("regression_guard", 0.12),
                ("verification_integrity", 0.14)
            ]
        );
        assert!((w.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(r.source, "built-in:swe");
        assert_eq!(r.sha256.len(), 64);
        assert!(r.system_prompt().contains("\"R7\": <score>"));
    }

    #[test]
    fn answers_are_read_strictly() {
        let r = Rubric::load("swe").unwrap();
        let all = |x: &str| {
            format!(
                r#"{{"reasoning": "ok", "scores": {{"R1": {x}, "R2": {x}, "R3": {x}, "R4": {x}, "R5": {x}, "R6": {x}, "R7": {x}}}}}"#
            )
        };
        let v = r.verdict(&all("0.5")).unwrap();
        assert!((v.j - 0.5).abs() < 1e-12);
        let fenced = format!("```json\n{}\n```", all("1.0"));
        assert!((r.verdict(&fenced).unwrap().j - 1.0).abs() < 1e-12);
        // Snapped to the grid.
        assert_eq!(r.verdict(&all("0.34")).unwrap().scores["R1"], 0.3);
        let mixed = r#"{"reasoning": "", "scores": {"R1": 1, "R2": 0, "R3": 0, "R4": 0, "R5": 0, "R6": 0, "R7": 0}}"#;
        assert!((r.verdict(mixed).unwrap().j - 0.15).abs() < 1e-12);
        for (bad, why) in [
            ("The patch looks fine. 8/10", "not a JSON object"),
            (r#"{"scores": {}}"#, "reasoning"),
            (r#"{"reasoning": "x"}"#, "scores"),
            (&all("1.5") as &str, "outside"),
            (&all("\"high\"") as &str, "no number for R1"),
            (
                &all("0.5").replace("\"R7\"", "\"R8\"") as &str,
                "R8, which is not a rubric",
            ),
        ] {
            let e = r.verdict(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_rubric_file_is_checked() {
        let bad = "name = \"x\"\ninstructions = \"i\"\n[[rubrics]]\nkey = \"A\"\nname = \"a\"\nweight = 0\ndescription = \"d\"\n";
        assert!(Rubric::parse(bad, "t".into())
            .unwrap_err()
            .to_string()
            .contains("not > 0"));
        assert!(Rubric::load("/nonexistent/rubric.toml")
            .unwrap_err()
            .to_string()
            .contains("neither a built-in rubric"));
    }
}
