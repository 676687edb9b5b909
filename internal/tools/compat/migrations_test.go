package compat

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// contractMarker, on the line before a statement of a migration's Up section, says that it
// contracts the schema knowingly: what it drops or narrows is used by no release of the
// window any more (docs/compatibility.md, "Migrations: expand, then contract").
const contractMarker = "-- compat: contract"

// contracting are the statements that can break a control plane of an older release running on
// the migrated database: dropping or renaming what it reads or writes, narrowing a column it
// writes, a new column it does not write that has no default.
var contracting = []*regexp.Regexp{
	regexp.MustCompile(`(?is)\bDROP\s+(TABLE|COLUMN|VIEW|FUNCTION|TYPE|SCHEMA|CONSTRAINT|TRIGGER|INDEX)\b`),
	regexp.MustCompile(`(?is)\bRENAME\b`),
	regexp.MustCompile(`(?is)\bALTER\s+COLUMN\s+\S+\s+(SET\s+NOT\s+NULL|(SET\s+DATA\s+)?TYPE)\b`),
	regexp.MustCompile(`(?is)\bADD\s+COLUMN\b(?:[^,]*?)\bNOT\s+NULL\b`), // refused below unless it has a DEFAULT
	regexp.MustCompile(`(?is)\bTRUNCATE\b`),
}

var hasDefault = regexp.MustCompile(`(?i)\bDEFAULT\b`)

// TestMigrationsSinceTheWindowOnlyExpand checks the migration rule of docs/compatibility.md on
// the tree: a migration an older release has is never changed or removed, and a migration added
// since the oldest release of the window (N-2) only expands the schema (new tables, columns with
// defaults or nullable, indexes), because that release's control plane must keep running on the
// database it migrates (TestUpgradeInPlace runs one).
func TestMigrationsSinceTheWindowOnlyExpand(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	from := releases[1]
	if err := exec.Command("git", "-C", root, "cat-file", "-e", from.commit+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this checkout (a shallow clone?)", from.commit[:12])
	}
	out, err := exec.Command("git", "-C", root, "ls-tree", "-r", "--name-only", from.commit).Output()
	if err != nil {
		t.Fatal(err)
	}
	released := map[string]bool{}
	for _, p := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if isMigration(p) {
			released[p] = true
		}
	}
	var now []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		if !d.IsDir() && isMigration(rel) {
			now = append(now, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A migration whose file moved with its package (internal/nodes to internal/core/nodes) is
	// the same migration of the same set: git finds it renamed, unchanged.
	out, err = exec.Command("git", "-C", root, "diff", "--name-status", "-M100%", "--diff-filter=R", from.commit, "--", "*.sql").Output()
	if err != nil {
		t.Fatal(err)
	}
	moved := map[string]string{} // the release's path → this tree's
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Split(l, "\t"); len(f) == 3 && isMigration(f[1]) {
			moved[f[1]] = f[2]
		}
	}
	releasedAs := map[string]string{} // this tree's path → the release's
	for p := range released {
		at := p
		if m, ok := moved[p]; ok {
			at = m
		}
		if !slices.Contains(now, at) {
			t.Errorf("%s is gone: a migration a release has applied stays, or that release's database cannot be migrated", p)
		}
		releasedAs[at] = p
	}
	added := 0
	for _, p := range now {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if old, ok := releasedAs[p]; ok {
			was, err := exec.Command("git", "-C", root, "show", from.commit+":"+old).Output()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(was, b) {
				t.Errorf("%s changed since %s (%s): a released migration never changes; add a new one", p, from.name, from.commit[:12])
			}
			continue
		}
		added++
		for _, stmt := range contractions(string(b)) {
			t.Errorf("%s contracts the schema, which the release %s still running on the database may use: %q; make it an expand step (docs/compatibility.md), or mark it %q once no release of the window uses what it removes",
				p, from.name, stmt, contractMarker)
		}
	}
	t.Logf("%d migrations added since %s, all expand-only", added, from.name)
}

func isMigration(p string) bool {
	return strings.HasSuffix(p, ".sql") && filepath.Base(filepath.Dir(p)) == "migrations"
}

// contractions are the statements of a migration's Up section that contract the schema,
// leaving out those marked with contractMarker.
func contractions(src string) []string {
	up, _, _ := strings.Cut(src, "-- +goose Down")
	var out []string
	marked := false
	var stmt strings.Builder
	for _, line := range strings.Split(up, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == contractMarker {
			marked = true
			continue
		}
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		stmt.WriteString(line)
		stmt.WriteString("\n")
		if !strings.HasSuffix(trimmed, ";") {
			continue
		}
		s := strings.Join(strings.Fields(stmt.String()), " ")
		stmt.Reset()
		if !marked && contracts(s) {
			out = append(out, s)
		}
		marked = false
	}
	return out
}

func contracts(stmt string) bool {
	for i, re := range contracting {
		if i == 3 {
			// A new NOT NULL column is an expansion when it has a default: the older release's
			// inserts, which do not name it, get it.
			for _, clause := range strings.Split(stmt, ",") {
				if re.MatchString(clause) && !hasDefault.MatchString(clause) {
					return true
				}
			}
			continue
		}
		if re.MatchString(stmt) {
			return true
		}
	}
	return false
}

// TestContractionsAreFound checks the migration rule's reader on statements it must and must not
// refuse.
func TestContractionsAreFound(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sql      string
		contract bool
	}{
		{"-- +goose Up\nCREATE TABLE compute.x (id uuid PRIMARY KEY, n int NOT NULL);\n-- +goose Down\nDROP TABLE compute.x;", false},
		{"-- +goose Up\nALTER TABLE compute.pools ADD COLUMN t text NOT NULL DEFAULT 'off' CHECK (t IN ('off', 'on'));", false},
		{"-- +goose Up\nALTER TABLE compute.pools ADD COLUMN t text;\nCREATE INDEX x ON compute.pools (t);", false},
		{"-- +goose Up\nALTER TABLE compute.pools ADD COLUMN t text NOT NULL;", true},
		{"-- +goose Up\nALTER TABLE compute.pools DROP COLUMN labels;", true},
		{"-- +goose Up\nALTER TABLE compute.pools RENAME COLUMN name TO title;", true},
		{"-- +goose Up\nALTER TABLE compute.pools ALTER COLUMN name TYPE varchar(10);", true},
		{"-- +goose Up\nALTER TABLE compute.pools ALTER COLUMN site_id SET NOT NULL;", true},
		{"-- +goose Up\nDROP INDEX compute.pools_name;", true},
		{"-- +goose Up\n-- compat: contract\nALTER TABLE compute.pools DROP COLUMN legacy;", false},
		{"-- +goose Up\n-- the old column is dropped later\nALTER TABLE compute.pools ADD COLUMN t text; -- DROP nothing", false},
	} {
		if got := len(contractions(c.sql)) > 0; got != c.contract {
			t.Errorf("contracts(%q) = %v, want %v", c.sql, got, c.contract)
		}
	}
}
