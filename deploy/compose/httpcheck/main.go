// Command httpcheck is the health probe of the etcd and Jaeger images. Those
// images are built FROM scratch (no shell, no curl), so their compose health
// checks exec this: it GETs a URL and exits 0 on a 2xx answer, 1 otherwise.
// With --print it prints the body instead: `make metrics` runs it on the
// stack's network to read a service's /metrics, which is not published.
//
//	httpcheck [--timeout 2s] [--contains TEXT] [--print] URL
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	timeout := flag.Duration("timeout", 2*time.Second, "give up after this long")
	contains := flag.String("contains", "", "also require the body to contain this text")
	printBody := flag.Bool("print", false, "print the body (at most 16 MiB) on stdout instead of the status line")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: httpcheck [flags] URL\n\nGETs URL; exits 0 on a 2xx answer (whose body contains --contains, if set), 1 otherwise.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := check(os.Stdout, flag.Arg(0), *timeout, *contains, *printBody); err != nil {
		fmt.Fprintf(os.Stderr, "httpcheck: %v\n", err)
		os.Exit(1)
	}
}

// A probe's body is read only to check it; a printed one is the answer
// itself (a replica's metrics with many ranges run to megabytes).
const (
	checkBodyLimit = 64 << 10
	printBodyLimit = 16 << 20
)

func check(out io.Writer, url string, timeout time.Duration, contains string, printBody bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	limit := int64(checkBodyLimit)
	if printBody {
		limit = printBodyLimit
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return fmt.Errorf("%s: read body: %w", url, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if contains != "" && !strings.Contains(string(body), contains) {
		return fmt.Errorf("%s: body %q lacks %q", url, strings.TrimSpace(string(body)), contains)
	}
	if printBody {
		_, err = out.Write(body)
		return err
	}
	fmt.Fprintf(out, "%s: %s\n", url, resp.Status)
	return nil
}
