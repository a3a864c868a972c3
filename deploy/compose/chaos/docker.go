package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tenurelog/tenure/pkg/auth"
)

// dockerTimeout bounds one docker CLI call. docker stop waits up to its own
// -t (10s) before killing, so this leaves room for that.
const dockerTimeout = 60 * time.Second

// docker runs the docker CLI on the host and returns its trimmed stdout.
func docker(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, dockerTimeout)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// stack is the compose project under test: its containers by service name,
// its network, and the host ports its services are published on. Only
// containers carrying the project's compose label are ever touched.
type stack struct {
	project string
	network string
	ids     map[string]string // service -> container id

	mu    sync.Mutex
	ports map[string]string // "service:port" -> "127.0.0.1:hostport"
}

func discover(ctx context.Context, project string) (*stack, error) {
	out, err := docker(ctx, "ps", "-a", "--filter", "label=com.docker.compose.project="+project,
		"--format", `{{.ID}} {{.Label "com.docker.compose.service"}}`)
	if err != nil {
		return nil, err
	}
	s := &stack{project: project, network: project + "_tenure", ids: map[string]string{}, ports: map[string]string{}}
	for _, line := range strings.Split(out, "\n") {
		id, svc, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok {
			s.ids[svc] = id
		}
	}
	for _, svc := range append([]string{"lease-1", "lease-2", "promoter-1", "promoter-2"}, allReplicaIDs...) {
		if s.ids[svc] == "" {
			return nil, fmt.Errorf("compose project %s has no %s container (is the stack up?)", project, svc)
		}
	}
	for svc, port := range map[string]string{"lease-1": "7000", "lease-2": "7000", "promoter-1": "7200", "promoter-2": "7200"} {
		if err := s.lookupPort(ctx, svc, port); err != nil {
			return nil, err
		}
	}
	for _, id := range allReplicaIDs {
		if err := s.lookupPort(ctx, id, "7100"); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// lookupPort asks docker where svc's port is published now. Published ports
// are ephemeral (the script asks for 127.0.0.1: with no port), so a
// container gets a new one whenever it starts or rejoins the network.
func (s *stack) lookupPort(ctx context.Context, svc, port string) error {
	out, err := docker(ctx, "port", s.ids[svc], port+"/tcp")
	if err != nil {
		return err
	}
	// One line per binding; the script publishes on 127.0.0.1 only.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "127.0.0.1:") {
			s.mu.Lock()
			s.ports[svc+":"+port] = line
			s.mu.Unlock()
			return nil
		}
	}
	return fmt.Errorf("%s port %s is not published on 127.0.0.1 (docker port says %q)", svc, port, out)
}

// refreshPort retries lookupPort for a bounded time: right after a start or
// a network connect, docker may not have bound the port yet.
func (s *stack) refreshPort(ctx context.Context, svc, port string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		err := s.lookupPort(ctx, svc, port)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// hostAddr maps a compose address ("replica-1:7100") to where it is
// published on the host, or returns it unchanged if unknown.
func (s *stack) hostAddr(addr string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.ports[addr]; ok {
		return a
	}
	return addr
}

// url is the host URL of svc's port.
func (s *stack) url(svc, port string) string { return scheme() + "://" + s.hostAddr(svc+":"+port) }

// leaseURLs is tenurectl's --lease on the host: both lease instances, at
// their published ports now.
func (s *stack) leaseURLs() string { return s.url("lease-1", "7000") + "," + s.url("lease-2", "7000") }

// tlsSource is the operator's certificate for a stack that runs mutual TLS
// (--cacert/--cert/--key), nil for a cleartext one.
var tlsSource *auth.Source

// scheme is the stack's URL scheme.
func scheme() string {
	if tlsSource != nil {
		return "https"
	}
	return "http"
}

// httpClient speaks HTTP/2 cleartext like transport.NewHTTPClient, but
// dials compose addresses at their published host ports, so the workload
// and the checkers use the same URLs (http://replica-1:7100) the replicas
// use among themselves. Pings detect a connection to a paused or
// disconnected container, so a dead connection is not reused for long.
func (s *stack) httpClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	var tlsConfig *tls.Config
	if tlsSource != nil {
		// The server's name is the compose one (replica-1), which its
		// certificate carries, whatever host port it is dialled at.
		p.SetHTTP2(true)
		tlsConfig = tlsSource.ClientConfig()
	}
	d := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Protocols:       &p,
		TLSClientConfig: tlsConfig,
		HTTP2:           &http.HTTP2Config{SendPingTimeout: time.Second, PingTimeout: time.Second},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, s.hostAddr(addr))
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// copyOut extracts the container path src (a file or directory) into dst,
// through docker cp's tar stream: it works on stopped containers, and the
// files land owned by whoever runs this, whatever uid the image runs as.
func (s *stack) copyOut(ctx context.Context, svc, src, dst string) error {
	ctx, cancel := context.WithTimeout(ctx, dockerTimeout)
	defer cancel()
	var errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", "cp", s.ids[svc]+":"+src, "-")
	cmd.Stderr = &errOut
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	xerr := untar(out, dst)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("docker cp %s:%s: %w: %s", svc, src, err, strings.TrimSpace(errOut.String()))
	}
	return xerr
}

// untar writes regular files and directories of a tar stream under dst,
// refusing names that escape it.
func untar(r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("tar entry %q escapes the destination", h.Name)
		}
		path := filepath.Join(dst, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}

// editFile rewrites one file inside a (stopped) container: docker cp it out
// as a tar, apply edit to its bytes, docker cp it back from a tar carrying
// the original header, so owner (the image's uid 65532) and mode stay as the
// replica needs them: the daemon applies a piped tar's uid and gid. (Not
// -a: that looks the container's user up in /etc/passwd, which a FROM
// scratch image lacks.) Those images have no shell to edit it inside.
func (s *stack) editFile(ctx context.Context, svc, path string, edit func([]byte) ([]byte, error)) error {
	ctx, cancel := context.WithTimeout(ctx, dockerTimeout)
	defer cancel()
	var raw, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", "cp", s.ids[svc]+":"+path, "-")
	cmd.Stdout, cmd.Stderr = &raw, &errOut
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("docker cp %s:%s: %w: %s", svc, path, err, strings.TrimSpace(errOut.String()))
	}
	tr := tar.NewReader(&raw)
	h, err := tr.Next()
	if err != nil {
		return fmt.Errorf("docker cp %s:%s: %w", svc, path, err)
	}
	if h.Typeflag != tar.TypeReg {
		return fmt.Errorf("%s:%s is not a regular file", svc, path)
	}
	data, err := io.ReadAll(tr)
	if err != nil {
		return err
	}
	data, err = edit(data)
	if err != nil {
		return err
	}
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	h.Size = int64(len(data))
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	errOut.Reset()
	cmd = exec.CommandContext(ctx, "docker", "cp", "-", s.ids[svc]+":"+filepath.Dir(path))
	cmd.Stdin, cmd.Stderr = &in, &errOut
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("docker cp - %s:%s: %w: %s", svc, filepath.Dir(path), err, strings.TrimSpace(errOut.String()))
	}
	return nil
}

// aliases returns svc's DNS aliases on the stack's network, to restore them
// after a disconnect (docker network connect without --alias loses them,
// and the replicas reach each other by those names).
func (s *stack) aliases(ctx context.Context, svc string) ([]string, error) {
	out, err := docker(ctx, "inspect", "--format",
		fmt.Sprintf(`{{range (index .NetworkSettings.Networks %q).Aliases}}{{.}} {{end}}`, s.network), s.ids[svc])
	if err != nil {
		return nil, err
	}
	var keep []string
	for _, a := range strings.Fields(out) {
		// The short container id is an alias docker adds by itself.
		if !strings.HasPrefix(s.ids[svc], a) {
			keep = append(keep, a)
		}
	}
	return keep, nil
}

// dockerCombined runs the docker CLI and returns stdout and stderr together
// (docker logs replays a container's stderr on its own stderr).
func dockerCombined(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, dockerTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("docker %s: %w: %.300s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
