package layers

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// module is the root module's path; its root package is idem.
const module = "github.com/idemgo/idem"

// shared is the one nested module the others may import besides the
// root: the RPC core's protobuf half, which the gRPC and Connect modules
// share and the root module, without protobuf, cannot hold.
const shared = module + "/middleware/rpcproto"

// rulesDoc is where the rules are listed, relative to the module's root.
const rulesDoc = "docs/ARCHITECTURE.md"

// A layer is one row of the rules' table.
type layer struct {
	name  string
	holds []string        // patterns: "idem:<file glob>", "pkg", "pkg/..."
	uses  map[string]bool // the other layers its units may use
	line  int             // in rulesDoc, for messages
}

// rules are the layers in the table's order: a unit is in the first that
// holds it.
type rules []*layer

var codeSpan = regexp.MustCompile("`([^`]+)`")

// readRules reads the table under the heading "## Rules" of rulesDoc.
func readRules(root string) (rules, error) {
	b, err := os.ReadFile(filepath.Join(root, rulesDoc))
	if err != nil {
		return nil, err
	}
	var rs rules
	in, table := false, false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if !in {
			in = line == "## Rules"
			continue
		}
		if strings.HasPrefix(line, "## ") || table && !strings.HasPrefix(line, "|") {
			break // the section, or its table, ended
		}
		if !strings.HasPrefix(line, "|") {
			continue
		}
		table = true
		cols := strings.Split(strings.Trim(line, "|"), "|")
		if len(cols) != 3 {
			return nil, fmt.Errorf("%s:%d: a row of the rules has %d columns; want 3 (layer, holds, may use)", rulesDoc, n, len(cols))
		}
		name := strings.TrimSpace(cols[0])
		if name == "layer" || strings.Trim(name, "-") == "" {
			continue // the header and its rule
		}
		l := &layer{name: name, uses: map[string]bool{}, line: n}
		for _, m := range codeSpan.FindAllStringSubmatch(cols[1], -1) {
			l.holds = append(l.holds, m[1])
		}
		for _, u := range strings.Fields(cols[2]) {
			l.uses[u] = true
		}
		if len(l.holds) == 0 {
			return nil, fmt.Errorf("%s:%d: layer %s holds no `unit`", rulesDoc, n, name)
		}
		rs = append(rs, l)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("%s: no table of layers under \"## Rules\"", rulesDoc)
	}
	names := map[string]bool{}
	for _, l := range rs {
		names[l.name] = true
	}
	for _, l := range rs {
		for u := range l.uses {
			if !names[u] {
				return nil, fmt.Errorf("%s:%d: layer %s may use %q, which is no layer", rulesDoc, l.line, l.name, u)
			}
		}
	}
	return rs, nil
}

// match reports whether pattern holds unit: "idem:core.go" (a file of
// package idem) or a package's path in the module ("sqlstore",
// "internal/retry").
func match(pattern, unit string) bool {
	if file, ok := strings.CutPrefix(pattern, "idem:"); ok {
		name, isFile := strings.CutPrefix(unit, "idem:")
		ok, _ := path.Match(file, name)
		return isFile && ok
	}
	if dir, ok := strings.CutSuffix(pattern, "/..."); ok {
		return unit == dir || strings.HasPrefix(unit, dir+"/")
	}
	return pattern == unit
}

// of returns the layer that holds unit, nil for none.
func (rs rules) of(unit string) *layer {
	for _, l := range rs {
		for _, p := range l.holds {
			if match(p, unit) {
				return l
			}
		}
	}
	return nil
}

// listed is one package of `go list -json`.
type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
	Error      *struct{ Err string }
}

// inModule reports whether an import path is a package of the root module.
func inModule(p string) bool { return p == module || strings.HasPrefix(p, module+"/") }

// pkgUnit is the unit of a package of the module other than idem.
func pkgUnit(p string) string { return strings.TrimPrefix(p, module+"/") }

// fileUnit is the unit of a file of package idem.
func fileUnit(filename string) string { return "idem:" + filepath.Base(filename) }

// load type-checks the packages of the module at dir, and those of the
// tree's other modules they import, from source, in the order of `go list
// -deps` (a package after those it imports), and takes every other package
// from the export data go list built.
func load(t *testing.T, dir string) (*token.FileSet, []*checked) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("finding the go command: %v", err)
	}
	cmd := exec.Command(goTool, "list", "-deps", "-export", "-json=ImportPath,Dir,GoFiles,Export,Error", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	var mine []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading go list's output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		if inModule(p.ImportPath) {
			mine = append(mine, p)
		} else {
			exports[p.ImportPath] = p.Export
		}
	}

	fset := token.NewFileSet()
	fromExport := importer.ForCompiler(fset, "gc", func(p string) (io.ReadCloser, error) {
		f, ok := exports[p]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", p)
		}
		return os.Open(f)
	})
	done := map[string]*types.Package{}
	imp := importerFunc(func(p string) (*types.Package, error) {
		if pkg, ok := done[p]; ok {
			return pkg, nil
		}
		if inModule(p) {
			return nil, fmt.Errorf("%s is imported before it was checked", p)
		}
		return fromExport.Import(p)
	})

	var all []*checked
	for _, p := range mine {
		c := &checked{path: p.ImportPath, info: &types.Info{Uses: map[*ast.Ident]types.Object{}}}
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatalf("parsing: %v", err)
			}
			c.files = append(c.files, f)
		}
		conf := types.Config{Importer: imp}
		pkg, err := conf.Check(p.ImportPath, fset, c.files, c.info)
		if err != nil {
			t.Fatalf("type-checking %s: %v", p.ImportPath, err)
		}
		done[p.ImportPath] = pkg
		all = append(all, c)
	}
	return fset, all
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// checked is one package of the module, type-checked from source.
type checked struct {
	path  string
	files []*ast.File
	info  *types.Info
}

// moduleRoot is the directory of the root module: this package sits at
// internal/testing/layers.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root: %v", err)
	}
	return root
}

// A mod is one module of the tree: its directory, relative to the root
// module's, and its path.
type mod struct{ dir, path string }

// modules lists the modules of the tree at root, the root module first, as
// .ci/modules.sh does: a directory with a go.mod, outside directories Go
// ignores (names starting with "." or "_", testdata).
func modules(t *testing.T, root string) []mod {
	t.Helper()
	mods := []mod{{".", module}}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || name != "go.mod" || filepath.Dir(p) == root {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(b)
		if m == nil {
			return fmt.Errorf("%s: no module line", p)
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		mods = append(mods, mod{filepath.ToSlash(rel), string(m[1])})
		return nil
	})
	if err != nil {
		t.Fatalf("listing the modules: %v", err)
	}
	return mods
}

// owner returns the module of mods a package belongs to: the longest
// module path that is the package's path or a prefix of it.
func owner(mods []mod, p string) string {
	best := ""
	for _, m := range mods {
		if (p == m.path || strings.HasPrefix(p, m.path+"/")) && len(m.path) > len(best) {
			best = m.path
		}
	}
	return best
}

// internalTo reports whether package p is internal to its module o: a
// path element "internal" below the module's path.
func internalTo(p, o string) bool {
	rel := strings.TrimPrefix(strings.TrimPrefix(p, o), "/")
	return rel == "internal" || strings.HasPrefix(rel, "internal/") || strings.Contains(rel, "/internal/") || strings.HasSuffix(rel, "/internal")
}

// TestRules holds every module of the tree to the rules of
// docs/ARCHITECTURE.md: each import of a package of the tree, and each
// identifier of package idem a file names, must be one the using unit's
// layer may use. A unit is a package by its path below the root module's
// ("grpc", "consumer/kafka"), whichever module holds it. Across modules,
// a nested module imports only the root module and the shared one, and
// nothing internal to them: each is published alone
// (.ci/publish-check.sh).
func TestRules(t *testing.T) {
	root := moduleRoot(t)
	rs, err := readRules(root)
	if err != nil {
		t.Fatal(err)
	}
	mods := modules(t, root)
	used := map[*layer]bool{}
	var imports, idents int
	var broken []string // sorted before they are reported: Uses is a map
	for _, m := range mods {
		fset, pkgs := load(t, filepath.Join(root, m.dir))
		i, n := check(t, root, rs, mods, m, fset, pkgs, used, &broken)
		imports, idents = imports+i, idents+n
	}
	slices.Sort(broken)
	for _, b := range broken {
		t.Error(b)
	}
	// A check that saw nothing would pass whatever the code did.
	if imports == 0 || idents == 0 {
		t.Fatalf("checked %d imports and %d identifiers across units; the loader found none", imports, idents)
	}
	for _, l := range rs {
		if !used[l] {
			t.Errorf("%s:%d: layer %s holds no package or file of the module", rulesDoc, l.line, l.name)
		}
	}
	t.Logf("%d modules, %d imports within the tree, %d uses of idem's identifiers across files", len(mods), imports, idents)
}

// check holds the packages of module m among pkgs to the rules, adding
// what breaks them to broken, and returns how many imports and
// identifiers it checked.
func check(t *testing.T, root string, rs rules, mods []mod, m mod, fset *token.FileSet, pkgs []*checked, used map[*layer]bool, broken *[]string) (imports, idents int) {

	// The layer of a unit, or an error naming the unit no layer holds.
	layerOf := func(unit string) *layer {
		l := rs.of(unit)
		if l == nil {
			t.Errorf("%s: no layer of %s's rules holds it; add it to a row", unit, rulesDoc)
			return nil
		}
		used[l] = true
		return l
	}
	allowed := func(from, to *layer) bool { return from == to || from.uses[to.name] }

	reported := map[string]bool{}
	for _, c := range pkgs {
		if owner(mods, c.path) != m.path {
			continue // another module's, checked with it
		}
		var pkgLayer *layer
		if c.path != module {
			pkgLayer = layerOf(pkgUnit(c.path))
		}
		for _, f := range c.files {
			name := fset.Position(f.Package).Filename
			rel, _ := filepath.Rel(root, name)
			from := pkgLayer
			if c.path == module {
				from = layerOf(fileUnit(name))
			}
			if from == nil {
				continue
			}
			for _, spec := range f.Imports {
				p := strings.Trim(spec.Path.Value, `"`)
				if !inModule(p) || p == module || p == c.path {
					continue // idem is checked by identifier, below
				}
				imports++
				if o := owner(mods, p); o != m.path && ((o != module && o != shared) || internalTo(p, o)) {
					*broken = append(*broken, fmt.Sprintf("%s:%d: imports %s, of module %s: module %s imports no other module but the root and %s, and nothing internal to them (%s: Modules)",
						rel, fset.Position(spec.Pos()).Line, p, o, m.path, shared, rulesDoc))
					continue
				}
				to := layerOf(pkgUnit(p))
				if to != nil && !allowed(from, to) {
					*broken = append(*broken, fmt.Sprintf("%s:%d: imports %s (layer %s), which layer %s may not use (%s:%d)",
						rel, fset.Position(spec.Pos()).Line, pkgUnit(p), to.name, from.name, rulesDoc, from.line))
				}
			}
			// Identifiers of package idem this file names, where declared.
			for id, obj := range c.info.Uses {
				if obj.Pkg() == nil || obj.Pkg().Path() != module || !obj.Pos().IsValid() {
					continue
				}
				pos := fset.Position(id.Pos())
				if pos.Filename != name {
					continue
				}
				decl := fset.Position(obj.Pos()).Filename
				if decl == name {
					continue
				}
				idents++
				to := layerOf(fileUnit(decl))
				if to == nil || allowed(from, to) {
					continue
				}
				key := rel + " " + id.Name
				if reported[key] {
					continue // one line per file and identifier
				}
				reported[key] = true
				*broken = append(*broken, fmt.Sprintf("%s:%d: uses %s, declared in %s (layer %s), which layer %s may not use (%s:%d)",
					rel, pos.Line, id.Name, filepath.Base(decl), to.name, from.name, rulesDoc, from.line))
			}
		}
	}
	return imports, idents
}

// A unit is in the first layer whose pattern holds it, and a unit no
// pattern holds is in none.
func TestMatch(t *testing.T) {
	rs := rules{
		{name: "script", holds: []string{"idem:script.go"}},
		{name: "store", holds: []string{"idem:store*.go", "sql"}},
		{name: "rigs", holds: []string{"internal/testing/..."}},
		{name: "plumbing", holds: []string{"internal/..."}},
	}
	for unit, want := range map[string]string{
		"idem:script.go":      "script",
		"idem:storekey.go":    "store",
		"sql":                 "store",
		"internal/testing":    "rigs",
		"internal/testing/x":  "rigs",
		"internal/retry":      "plumbing",
		"internal/retry/deep": "plumbing",
		"idem:other.go":       "",
		"sqlx":                "",
		"sql/sub":             "",
		"script.go":           "",
		"internalx":           "",
	} {
		got := ""
		if l := rs.of(unit); l != nil {
			got = l.name
		}
		if got != want {
			t.Errorf("layer of %q = %q; want %q", unit, got, want)
		}
	}
}
