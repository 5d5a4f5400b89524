//! PNG curves of an epoch history: one chart per quantity (validation twins on the same
//! chart), rates left out, valid PNGs of the stated size.

use ferrite_train::plot::write_plots;
use ferrite_train::trainer::Logs;

#[test]
fn one_png_per_quantity_with_its_validation_curve() {
    let history: Vec<Logs> = (0..5)
        .map(|e| {
            let e = e as f64;
            [
                ("loss", 1.0 / (1.0 + e)),
                ("val_loss", 1.2 / (1.0 + e)),
                ("acc", 0.5 + 0.08 * e),
                ("val_acc", 0.45 + 0.08 * e),
                ("lr", 1e-3),
                ("samples_per_s", 1000.0),
                ("data_wait", 0.01),
                ("val_f1", 0.4 + 0.1 * e),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("ferrite-plot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = write_plots(&history, &dir).unwrap();
    let mut names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["acc.png", "f1.png", "loss.png"]);
    for f in &files {
        let img = image::open(f).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (800, 500));
        // The curves were drawn: training in blue, validation in red.
        let lines = img
            .pixels()
            .filter(|p| p.0 == [0, 0, 255] || p.0 == [255, 0, 0])
            .count();
        assert!(lines > 100, "{}: {lines} curve pixels", f.display());
    }
    // A history with a non-finite value still plots (the point is left out).
    let mut h = history.clone();
    h[2].insert("loss".into(), f64::NAN);
    assert_eq!(write_plots(&h, &dir).unwrap().len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}
