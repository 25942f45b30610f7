// Package readme checks that every Go block of the repository's README.md
// is code that compiles and runs: each block must be, character for
// character, a region of an example test file of the module whose packages
// it uses, where `go test` in that module (make test runs every module)
// compiles it in its place, beside the blocks a reader pastes with it, and
// runs it when it can run on the memory store or miniredis.
//
// A region opens with a line `// README: name` and ends before a line
// `// README end` or the closing brace of its function, and is compared
// with the indentation of its opening line removed. A README block found
// in no region, and a region found in no README block, fail the test.
package readme

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// block is a README code block or an example file's region.
type block struct {
	where string // file:line of its first line
	name  string // a region's name
	text  string
}

// root is the repository's root: this package sits three levels down.
const root = "../../.."

// readmeBlocks returns README.md's ```go blocks.
func readmeBlocks(t *testing.T, path string) []block {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	var cur *block
	var lines []string
	for i, line := range strings.Split(string(data), "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &block{where: fmt.Sprintf("README.md:%d", i+2)}
			lines = nil
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.text = strings.Join(lines, "\n")
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			lines = append(lines, line)
		}
	}
	if cur != nil {
		t.Fatalf("%s: a ```go block is not closed", cur.where)
	}
	return blocks
}

var regionStart = regexp.MustCompile(`^(\s*)// README: (\S+)\s*$`)

// regions returns the regions of every _test.go file under dir.
func regions(t *testing.T, dir string) []block {
	t.Helper()
	var out []block
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		rel, _ := filepath.Rel(dir, path)
		var cur *block
		var indent string
		var lines []string
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if cur != nil && (strings.TrimSpace(line) == "// README end" || line == "}") {
				cur.text = strings.Join(lines, "\n")
				out = append(out, *cur)
				cur = nil
				continue
			}
			if m := regionStart.FindStringSubmatch(line); m != nil {
				if cur != nil {
					t.Errorf("%s:%d: region %q opens inside region %q", rel, n, m[2], cur.name)
				}
				cur = &block{where: fmt.Sprintf("%s:%d", rel, n+1), name: m[2]}
				indent, lines = m[1], nil
				continue
			}
			if cur != nil {
				if line != "" && !strings.HasPrefix(line, indent) {
					t.Errorf("%s:%d: region %q: line indented less than its opening line", rel, n, cur.name)
				}
				lines = append(lines, strings.TrimPrefix(line, indent))
			}
		}
		if cur != nil {
			t.Errorf("%s: region %q is not closed", rel, cur.name)
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestREADMEBlocksAreExamples fails for each README Go block that is not
// an example file's region, and for each region no README block shows.
func TestREADMEBlocksAreExamples(t *testing.T) {
	readme := readmeBlocks(t, filepath.Join(root, "README.md"))
	if len(readme) == 0 {
		t.Fatal("README.md has no ```go block; is root wrong?")
	}
	regs := regions(t, root)
	names := map[string]string{}
	for _, r := range regs {
		if w, ok := names[r.name]; ok {
			t.Errorf("%s: region %q is also at %s", r.where, r.name, w)
		}
		names[r.name] = r.where
	}
	used := make([]bool, len(regs))
	for _, b := range readme {
		i := slices.IndexFunc(regs, func(r block) bool { return r.text == b.text })
		if i >= 0 {
			used[i] = true
			continue
		}
		near := nearest(b, regs)
		if near < 0 {
			t.Errorf("%s: this Go block is in no example file (mark its copy there with // README: name):\n%s", b.where, b.text)
			continue
		}
		t.Errorf("%s: this Go block differs from region %q at %s, the nearest:\n%s", b.where, regs[near].name, regs[near].where, diff(regs[near].text, b.text))
	}
	for i, r := range regs {
		if !used[i] && nearest(r, readme) < 0 {
			t.Errorf("%s: region %q is in no README Go block: remove its marker, or show it", r.where, r.name)
		}
	}
}

// nearest returns the index of the block of bs sharing the most telling
// lines with b (at least half of b's), or -1. A line of fewer than 20
// characters (a brace, `if err != nil {`, `log.Fatal(err)`) tells nothing.
func nearest(b block, bs []block) int {
	telling := func(l string) bool { return len(strings.TrimSpace(l)) >= 20 }
	have := map[string]bool{}
	lines := 0
	for _, l := range strings.Split(b.text, "\n") {
		if telling(l) {
			have[l] = true
			lines++
		}
	}
	best, bestN := -1, 0
	for i, c := range bs {
		n := 0
		for _, l := range strings.Split(c.text, "\n") {
			if telling(l) && have[l] {
				n++
			}
		}
		if n > bestN {
			best, bestN = i, n
		}
	}
	if bestN*2 < lines {
		return -1
	}
	return best
}

// diff shows the lines of want (the region) and got (the README block)
// that the other lacks.
func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var sb strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			fmt.Fprintf(&sb, "  example: %s\n", l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			fmt.Fprintf(&sb, "  README:  %s\n", l)
		}
	}
	if sb.Len() == 0 {
		sb.WriteString("  (the same lines, in another order or with other blank lines)\n")
	}
	return sb.String()
}
