//! Lowering's view of a program's files: loading modules and their
//! imports, which functions do IO, and the `bprop` and `jvp_` rule items.

use super::*;

impl Lowerer<'_> {
    pub(super) fn load_module(&mut self, file: FileId, dir: Option<PathBuf>) -> usize {
        let text = self.sources.text(file).to_string();
        let (ast, diags) = adjoint_lang::parse(file, &text);
        self.diags.extend(diags);
        let ast = Rc::new(ast);
        let idx = self.mods.len();
        let mut fns = HashMap::new();
        let mut bprops = HashMap::new();
        for (i, item) in ast.items.iter().enumerate() {
            if let Item::Bprop(def) = item {
                if bprops.insert(def.name.name.clone(), i).is_some() {
                    self.error(Diagnostic::error(
                        format!("`{}` has two bprop rules", def.name.name),
                        def.name.span,
                    ));
                }
            }
            if let Item::Fn(def) = item {
                if let Some(prev) = fns.insert(def.name.name.clone(), i) {
                    let prev_span = match &ast.items[prev] {
                        Item::Fn(p) => p.name.span,
                        _ => def.name.span,
                    };
                    self.error(
                        Diagnostic::error(
                            format!("function `{}` is defined twice", def.name.name),
                            def.name.span,
                        )
                        .with_secondary(prev_span, "first defined here"),
                    );
                }
            }
        }
        // A user's rule is for a function of its own file: one for a name
        // that is none (a misspelling) would never be used. (The standard
        // library's rule files hold the primitives' rules.)
        let user_file = !self.sources.name(file).starts_with("<stdlib>");
        for item in ast.items.iter().filter(|_| user_file) {
            if let Item::Bprop(def) = item {
                if !fns.contains_key(&def.name.name) {
                    let mut d = Diagnostic::error(
                        format!(
                            "bprop rule for `{}`, which is not a function of this file",
                            def.name.name
                        ),
                        def.name.span,
                    )
                    .with_label("no function of this name");
                    if let Some(best) = fns
                        .keys()
                        .filter(|k| edit_distance(k, &def.name.name) <= 2)
                        .min_by_key(|k| (edit_distance(k, &def.name.name), k.to_string()))
                    {
                        d = d.with_note(format!("a similar name exists: `{best}`"));
                    }
                    self.error(d);
                }
            }
        }
        self.mods.push(ModInfo {
            file,

            ast: ast.clone(),
            fns,
            bprops,
            imports: HashMap::new(),
            internal: false,
        });
        for item in ast.items.iter() {
            if let Item::Import(imp) = item {
                self.load_import(idx, imp, dir.as_deref());
            }
        }
        idx
    }

    pub(super) fn load_import(&mut self, from: usize, imp: &ast::Import, dir: Option<&Path>) {
        let (key, alias, text, name, idir) = match &imp.module {
            ast::ImportPath::Name(id) => {
                let Some((_, src)) = STDLIB.iter().find(|(n, _)| *n == id.name) else {
                    self.error(
                        Diagnostic::error(
                            format!("no standard library module named `{}`", id.name),
                            id.span,
                        )
                        .with_note(format!(
                            "the standard library has: {}",
                            STDLIB
                                .iter()
                                .map(|(n, _)| *n)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                    );
                    return;
                };
                let alias = imp
                    .alias
                    .as_ref()
                    .map_or(id.name.clone(), |a| a.name.clone());
                (
                    format!("<stdlib>/{}", id.name),
                    alias,
                    src.to_string(),
                    format!("<stdlib>/{}.adj", id.name),
                    None,
                )
            }
            ast::ImportPath::File { path, span } => {
                let full = match dir {
                    Some(d) => d.join(path),
                    None => PathBuf::from(path),
                };
                let alias = match &imp.alias {
                    Some(a) => a.name.clone(),
                    None => Path::new(path)
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_else(|| path.clone()),
                };
                let text = match self.loader.load(&full) {
                    Ok(t) => t,
                    Err(e) => {
                        self.error(Diagnostic::error(
                            format!("cannot import \"{}\": {}", full.display(), io_reason(&e)),
                            *span,
                        ));
                        return;
                    }
                };
                let key = full
                    .canonicalize()
                    .unwrap_or(full.clone())
                    .display()
                    .to_string();
                let idir = full.parent().map(|p| p.to_path_buf());
                (key, alias, text, full.display().to_string(), idir)
            }
        };
        let target = match self.mod_by_path.get(&key) {
            Some(m) => *m,
            None => {
                if self.mods.len() > 1000 {
                    self.error(Diagnostic::error("too many imported modules", imp.span));
                    return;
                }
                let file = self.sources.add_file(name, text);
                // Register before loading, so import cycles terminate.
                self.mod_by_path.insert(key.clone(), self.mods.len());
                let m = self.load_module(file, idir);
                if key.starts_with("<stdlib>/") {
                    self.mods[m].internal = true;
                }
                m
            }
        };
        self.mods[from].imports.insert(alias, target);
    }

    /// Which functions perform IO, directly or through the functions they
    /// call by name (a fixpoint over the call graph).
    pub(super) fn compute_effects(&mut self) {
        let mut calls: HashMap<FnKey, Vec<CallTarget>> = HashMap::new();
        for (mi, m) in self.mods.iter().enumerate() {
            for (i, item) in m.ast.items.iter().enumerate() {
                if let Item::Fn(def) = item {
                    calls.insert(
                        FnKey {
                            module: mi,
                            item: i,
                        },
                        scan::calls_in(&def.body),
                    );
                }
            }
        }
        loop {
            let mut changed = false;
            for (key, targets) in &calls {
                if self.effectful.contains(key) {
                    continue;
                }
                let is_main = matches!(
                    &self.mods[key.module].ast.items[key.item],
                    Item::Fn(def) if def.name.name == "main"
                );
                if is_main || targets.iter().any(|t| self.target_effectful(key.module, t)) {
                    self.effectful.insert(*key);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    pub(super) fn target_effectful(&self, module: usize, t: &CallTarget) -> bool {
        match t {
            CallTarget::Name(n) => {
                if is_io_name(n) {
                    return true;
                }
                self.global_fn(module, n)
                    .is_some_and(|k| self.effectful.contains(&k))
            }
            CallTarget::Member(m, n) => self.mods[module]
                .imports
                .get(m)
                .and_then(|mi| self.mods[*mi].fns.get(n).map(|i| (*mi, *i)))
                .is_some_and(|(mi, i)| {
                    self.effectful.contains(&FnKey {
                        module: mi,
                        item: i,
                    })
                }),
        }
    }

    /// A global function visible by plain name from `module`: its own, or
    /// the prelude's. The tangent rules (`stdlib/jvp.adj`) also see the
    /// helpers of the reverse rules (`stdlib/bprop.adj`), so a rule shared
    /// by both modes is written once.
    pub(super) fn global_fn(&self, module: usize, name: &str) -> Option<FnKey> {
        if let Some(i) = self.mods[module].fns.get(name) {
            return Some(FnKey { module, item: *i });
        }
        if let (Some(j), Some(b)) = (self.jvp_mod, self.bprop_mod) {
            if module == j {
                if let Some(i) = self.mods[b].fns.get(name) {
                    return Some(FnKey {
                        module: b,
                        item: *i,
                    });
                }
            }
        }
        let p = self.prelude?;
        self.mods[p].fns.get(name).map(|i| FnKey {
            module: p,
            item: *i,
        })
    }

    pub(super) fn fn_def(&self, key: FnKey) -> Rc<FnDef> {
        match &self.mods[key.module].ast.items[key.item] {
            Item::Fn(def) | Item::Bprop(def) => Rc::new(def.clone()),
            _ => unreachable!("function keys point at functions"),
        }
    }

    /// The graph of a global function, creating it (and queueing its body)
    /// on first use.
    pub(super) fn fn_graph(&mut self, key: FnKey) -> GraphId {
        if let Some(g) = self.fn_graphs.get(&key) {
            return *g;
        }
        let def = self.fn_def(key);
        let name = match &self.mods[key.module].ast.items[key.item] {
            Item::Bprop(_) => format!("bprop.{}", def.name.name),
            _ => def.name.name.clone(),
        };
        let g = self.m.add_graph(name, loc(def.name.span));
        self.fn_graphs.insert(key, g);
        let is_fn = matches!(self.mods[key.module].ast.items[key.item], Item::Fn(_));
        if is_fn && def.params.iter().any(|p| p.default.is_some()) {
            self.with_defaults.insert(g, (def.clone(), Some(key)));
        }
        self.pending.push((key, g));
        g
    }

    /// Lowers the reverse rules: the standard library's, for primitives,
    /// and the program's own, for its functions.
    pub(super) fn lower_rules(&mut self) -> Rules {
        let mut rules = Rules::default();
        for module in 0..self.mods.len() {
            let bprops: Vec<(String, usize)> = self.mods[module]
                .bprops
                .iter()
                .map(|(n, i)| (n.clone(), *i))
                .collect();
            for (name, item) in bprops {
                let span = match &self.mods[module].ast.items[item] {
                    Item::Bprop(d) => d.name.span,
                    _ => continue,
                };
                let rule = self.fn_graph(FnKey { module, item });
                if Some(module) == self.bprop_mod {
                    match Prim::from_name(&name) {
                        Some(p) => {
                            rules.prims.insert(p, rule);
                        }
                        None => self.error(Diagnostic::error(
                            format!("bprop for unknown primitive `{name}`"),
                            span,
                        )),
                    }
                } else {
                    match self.mods[module].fns.get(&name).copied() {
                        Some(f) => {
                            let g = self.fn_graph(FnKey { module, item: f });
                            rules.user.insert(g, rule);
                        }
                        None => self.error(Diagnostic::error(
                            format!("bprop for unknown function `{name}`"),
                            span,
                        )
                        .with_note("a bprop item gives the derivative of a function defined in the same file")),
                    }
                }
            }
        }
        self.lower_tangent_rules(&mut rules);
        self.drain_pending();
        let missing = crate::ad::missing_rules(&rules);
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|p| p.name()).collect();
            let span = Span::point(self.mods[self.bprop_mod.unwrap_or(0)].file, 0);
            self.error(
                Diagnostic::error(
                    format!("no derivative rule for: {}", names.join(", ")),
                    span,
                )
                .with_note("every differentiable primitive needs a `bprop` in stdlib/bprop.adj"),
            );
        }
        let missing = crate::ad::missing_tangent_rules(&rules);
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|p| p.name()).collect();
            let span = Span::point(self.mods[self.jvp_mod.unwrap_or(0)].file, 0);
            self.error(
                Diagnostic::error(format!("no tangent rule for: {}", names.join(", ")), span)
                    .with_note(
                        "every differentiable primitive needs a `jvp_` function in stdlib/jvp.adj",
                    ),
            );
        }
        rules
    }

    /// Lowers the tangent rules of forward mode: the functions `jvp_P` of
    /// `stdlib/jvp.adj`, one per primitive `P` (other functions there are
    /// helpers).
    pub(super) fn lower_tangent_rules(&mut self, rules: &mut Rules) {
        let Some(module) = self.jvp_mod else {
            return;
        };
        let mut fns: Vec<(String, usize)> = self.mods[module]
            .fns
            .iter()
            .map(|(n, i)| (n.clone(), *i))
            .collect();
        fns.sort_by_key(|(_, i)| *i);
        for (name, item) in fns {
            let Some(pname) = name.strip_prefix("jvp_") else {
                continue;
            };
            let span = match &self.mods[module].ast.items[item] {
                Item::Fn(d) => d.name.span,
                _ => continue,
            };
            let problem = match Prim::from_name(pname) {
                None => Some(format!("tangent rule for unknown primitive `{pname}`")),
                Some(p) if !p.info().differentiable => Some(format!(
                    "tangent rule for `{p}`, which is not differentiable"
                )),
                Some(p) if crate::ad::tangent_is_generated(p) => Some(format!(
                    "tangent rule for `{p}`, whose rule the forward transform generates"
                )),
                Some(p) => {
                    let g = self.fn_graph(FnKey { module, item });
                    rules.tangents.insert(p, g);
                    None
                }
            };
            if let Some(message) = problem {
                self.error(Diagnostic::error(message, span));
            }
        }
    }

    /// A primitive callable by this name from `module`.
    pub(super) fn prim_named(&self, module: usize, name: &str) -> Option<Prim> {
        if self.mods[module].internal {
            Prim::from_name(name)
        } else {
            user_prim(name)
        }
    }

    pub(super) fn drain_pending(&mut self) {
        while let Some((key, g)) = self.pending.pop() {
            let def = self.fn_def(key);
            let effectful = self.effectful.contains(&key);
            let saved = std::mem::take(&mut self.scopes);
            let module = key.module;
            if let Err(d) = self.lower_function(module, g, &def, effectful) {
                self.error(d);
                // Leave a well-formed graph behind.
                if self.m.graph(g).output.is_none() {
                    let u = self.m.add_const(Const::Unit, Loc::NONE);
                    self.m.set_output(g, u);
                }
            }
            self.scopes = saved;
        }
    }
}
