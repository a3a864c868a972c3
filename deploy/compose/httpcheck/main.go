// Command httpcheck is the health probe of the etcd and Jaeger images. Those
// images are built FROM scratch (no shell, no curl), so their compose health
// checks exec this: it GETs a URL and exits 0 on a 2xx answer, 1 otherwise.
//
//	httpcheck [--timeout 2s] [--contains TEXT] URL
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
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: httpcheck [flags] URL\n\nGETs URL; exits 0 on a 2xx answer (whose body contains --contains, if set), 1 otherwise.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := check(flag.Arg(0), *timeout, *contains); err != nil {
		fmt.Fprintf(os.Stderr, "httpcheck: %v\n", err)
		os.Exit(1)
	}
}

func check(url string, timeout time.Duration, contains string) error {
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
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("%s: read body: %w", url, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if contains != "" && !strings.Contains(string(body), contains) {
		return fmt.Errorf("%s: body %q lacks %q", url, strings.TrimSpace(string(body)), contains)
	}
	fmt.Printf("%s: %s\n", url, resp.Status)
	return nil
}
