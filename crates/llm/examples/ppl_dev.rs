//! Development check: perplexity of the first window of a fixture.
use ferrite_llm::generate::mean_nll;
use ferrite_llm::{Model, Session};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mut model = Model::load(&args[1])?;
    if std::env::var_os("X2").is_some() {
        model.set_precision(ferrite_llm::Precision::Q8x2);
    }
    if std::env::var_os("Q8").is_some() {
        model.set_precision(ferrite_llm::Precision::Q8);
    }
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&args[2])?)?;
    let wi: usize = std::env::var("WIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let w = &fx["perplexity"]["windows"][wi];
    let ids: Vec<u32> = w["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let mut s = Session::new(&model, ids.len())?;
    let (nll, _) = mean_nll(&mut s, &ids)?;
    println!("ppl {:.4} ref {:.4}", nll.exp(), w["ppl"].as_f64().unwrap());
    Ok(())
}
