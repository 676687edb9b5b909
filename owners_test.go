package compute_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	createTableRE = regexp.MustCompile(`(?i)\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?((?:compute|iam)\.[a-z_]+)`)
	writeRE       = regexp.MustCompile(`(?i)\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+((?:compute|iam)\.[a-z_]+)\b`)
	sqlCommentRE  = regexp.MustCompile(`--[^\n]*`)
)

// knownWriters are the writes of a table by a package that does not own it, each with why, as
// "package: table". TestOneWriterPerTable fails when one of them no longer occurs, so the list
// only shrinks.
var knownWriters = map[string]string{
	// A benchmark's fixture, not a product path: it books every node directly, because the fill
	// is not what is measured.
	"internal/tools/cmd/placebench: compute.reservations": "the fill",
	"internal/tools/cmd/placebench: compute.bookings":     "the fill",
}

// TestOneWriterPerTable keeps the rule that each table is written only by the package that owns
// its migration set (the directory above the migrations/ that creates it): every INSERT, UPDATE,
// DELETE or TRUNCATE of a compute or iam table in the SQL of a non-test Go file's string literals,
// or of a migration's SQL (triggers and functions included), must be its owner's. Another
// package calls the owner's functions.
func TestOneWriterPerTable(t *testing.T) {
	t.Parallel()
	owner := map[string]string{} // table → package directory
	type write struct{ pkg, table, at string }
	var writes []write
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "shared") {
				return filepath.SkipDir
			}
			return nil
		}
		p = filepath.ToSlash(p)
		switch {
		case path.Base(path.Dir(p)) == "migrations" && strings.HasSuffix(p, ".sql"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			pkg := path.Dir(path.Dir(p))
			sql := sqlCommentRE.ReplaceAllString(string(b), "")
			for _, m := range createTableRE.FindAllStringSubmatch(sql, -1) {
				owner[strings.ToLower(m[1])] = pkg
			}
			for _, m := range writeRE.FindAllStringSubmatch(sql, -1) {
				writes = append(writes, write{pkg, strings.ToLower(m[1]), p})
			}
		case strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go"):
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				for _, m := range writeRE.FindAllStringSubmatch(lit.Value, -1) {
					writes = append(writes, write{path.Dir(p), strings.ToLower(m[1]), fset.Position(lit.Pos()).String()})
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if owner["compute.nodes"] != "internal/core/fleet" {
		t.Fatalf("found no migration creating compute.nodes in internal/core/fleet: the walk is broken (owners %v)", owner)
	}
	seen := map[string]bool{}
	var wrong []string
	for _, w := range writes {
		o, ok := owner[w.table]
		switch key := w.pkg + ": " + w.table; {
		case !ok:
			wrong = append(wrong, w.at+": writes "+w.table+", which no migration creates")
		case o == w.pkg:
		case knownWriters[key] != "":
			seen[key] = true
		default:
			wrong = append(wrong, w.at+": "+w.pkg+" writes "+w.table+", which "+o+" owns; call "+o+"'s functions instead")
		}
	}
	for key := range knownWriters {
		if !seen[key] {
			wrong = append(wrong, "knownWriters lists "+key+", which no longer occurs: remove it")
		}
	}
	slices.Sort(wrong)
	if len(wrong) > 0 {
		t.Fatal("one writer per table:\n" + strings.Join(wrong, "\n"))
	}
}
