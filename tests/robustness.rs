use adjoint::{Mode, Session};
use std::time::Instant;

#[test]
fn scratch() {
    for (name, src) in [
        (
            "a.adj",
            "fn main() { let x: f32[3] = zeros([3]); let y = zeros([5, 2]); print(x @ y); }",
        ),
        ("b.adj", "fn main() { print(1 +; }"),
        ("c.adj", "fn main() { print(load_npy(\"/nonexist.npy\")); }"),
        ("d.adj", "fn main() { print(1); }"),
        ("e.adj", ""),
        ("f.adj", "fn"),
    ] {
        let t = Instant::now();
        let r = Session::new(Mode::Eager).load_source(name, src);
        match r {
            Err(e) => println!("LOAD ERR {name}: {}", e.render(false)),
            Ok(s) => match s.check() {
                Err(e) => println!("CHECK ERR {name}: {}", e.render(false)),
                Ok(()) => {
                    let mut out = Vec::new();
                    match s.run_main(&mut out) {
                        Err(e) => println!("RUN ERR {name}: {}", e.render(false)),
                        Ok(()) => println!("OK {name}: {}", String::from_utf8_lossy(&out)),
                    }
                }
            },
        }
        println!("time {:?}", t.elapsed());
    }
}
