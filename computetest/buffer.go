package computetest

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is output one goroutine writes (a process's stdout, a logger) while the test reads it:
// a bytes.Buffer behind a mutex.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Contains reports whether s has been written.
func (b *Buffer) Contains(s string) bool {
	return strings.Contains(b.String(), s)
}
