package bench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// rwCallsCounter counts this process's read-like and write-like system
// calls (read, write, pread, pwrite, their vector forms, sends and
// receives: syscr and syscw of /proc/self/io). Every message between
// in-process servers and their clients is a write and at least one read,
// so where CPU per record is mostly system calls (many ranges, one record
// a call) this is the count that CPU follows. It needs no tracefs, unlike
// syncs/record. It counts this process only: servers in processes of
// their own (the ...Procs benchmarks) are not in it.
var rwCallsCounter = counter{unit: "rw-calls/record", read: processRWCalls}

// processRWCalls returns syscr + syscw of /proc/self/io.
func processRWCalls() (uint64, error) {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var sum uint64
	found := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		name, value, ok := strings.Cut(s.Text(), ":")
		if !ok || (name != "syscr" && name != "syscw") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/self/io %s: %w", name, err)
		}
		sum += n
		found++
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	if found != 2 {
		return 0, fmt.Errorf("/proc/self/io: syscr or syscw missing")
	}
	return sum, nil
}

// The counter rises by at least the writes and reads this test makes.
func TestProcessRWCalls(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	before, err := processRWCalls()
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	buf := []byte{1}
	for range n {
		if _, err := w.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	after, err := processRWCalls()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 2*n {
		t.Fatalf("the counter rose by %d, want at least the %d calls made", after-before, 2*n)
	}
}
