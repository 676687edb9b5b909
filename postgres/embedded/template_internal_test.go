package embedded

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDiscardedTemplateIsNeverHalfThere: a template given up (an older prepared one, or one
// that could not be copied) leaves its name at once, before its files go: a process that dies
// removing it (here, a removal that stops after one file) leaves no half template for the next
// start to copy.
func TestDiscardedTemplateIsNeverHalfThere(t *testing.T) {
	removeAll = func(path string) error { // removes one file, as a process killed partway would
		return filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				os.Remove(p)
				return filepath.SkipAll
			}
			return err
		})
	}
	t.Cleanup(func() { removeAll = os.RemoveAll })
	cache := t.TempDir()
	old := filepath.Join(cache, "pg-0123456789abcdef01234567-aaaaaaaaaaaa")
	for _, f := range []string{"PG_VERSION", "better-compute.password", "global/pg_control"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(old, f)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(old, f), []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-2 * templateUnused)
	if err := os.Chtimes(old, long, long); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "PG_VERSION"), []byte("17\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{dataDir: data}
	if err := c.keepTemplate(filepath.Join(cache, "pg-0123456789abcdef01234567-bbbbbbbbbbbb")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(old); !os.IsNotExist(err) {
		t.Fatalf("the older prepared template is still at its name while it is removed: %v", err)
	}
	if c.fromTemplate(old, nil) {
		t.Fatal("a start copied the template that was being removed")
	}
}
