// Command s3load is the load generator of bench/s3.sh: aws-sdk-go-v2
// clients doing GETs or PUTs of one object size at a fixed concurrency
// for a fixed time, printing one JSON line with ops/s, MB/s (10^6 bytes),
// latency percentiles and its own CPU time per op.
//
//	s3load -mode prep -size 1MiB -objects 64 -c 8       # create the bucket, write the GET set
//	s3load -mode get  -size 1MiB -objects 64 -c 8 -duration 8s
//	s3load -mode put  -size 1MiB -objects 64 -c 8 -duration 8s
//
// The endpoint, keys and CA default to AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_CA_BUNDLE (a basalt s3.env). Requests are path-style and
// signed as the SDK signs them by default (SigV4 with a payload hash on
// plain HTTP), so server and client share the machine's CPUs as real
// clients would. GET reads random keys of the prepared set; PUT
// overwrites a ring of -objects keys (-objects/c per worker), so a long
// run does not fill the disk. Ops completing in the first -warmup are not
// counted. Any failed request makes the exit status 1 (after the JSON).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// Result is what s3load prints.
type Result struct {
	Label       string  `json:"label,omitempty"`
	Mode        string  `json:"mode"`
	Size        int64   `json:"size"`
	Concurrency int     `json:"concurrency"`
	Seconds     float64 `json:"seconds"`
	Ops         int     `json:"ops"`
	OpsPerSec   float64 `json:"ops_per_s"`
	MBPerSec    float64 `json:"mb_per_s"`
	P50ms       float64 `json:"p50_ms"`
	P99ms       float64 `json:"p99_ms"`
	Errors      int     `json:"errors"`
	// CPUus is this process's CPU time (user + system) per counted op,
	// over the whole run, warm-up included.
	CPUus      float64 `json:"client_cpu_us"`
	FirstError string  `json:"first_error,omitempty"`
}

func main() {
	var (
		endpoint = flag.String("endpoint", os.Getenv("AWS_ENDPOINT_URL"), "S3 endpoint URL")
		access   = flag.String("access", os.Getenv("AWS_ACCESS_KEY_ID"), "access key id")
		secret   = flag.String("secret", os.Getenv("AWS_SECRET_ACCESS_KEY"), "secret access key")
		region   = flag.String("region", "us-east-1", "region")
		bucket   = flag.String("bucket", "bench", "bucket")
		mode     = flag.String("mode", "get", "prep, get or put")
		sizeStr  = flag.String("size", "1MiB", "object size (bytes, or with KiB/MiB)")
		objects  = flag.Int("objects", 64, "keys in the GET set / the PUT ring")
		conc     = flag.Int("c", 8, "concurrent requests")
		duration = flag.Duration("duration", 8*time.Second, "measured time")
		warmup   = flag.Duration("warmup", time.Second, "time before measuring")
		label    = flag.String("label", "", "label copied into the output")
		caFile   = flag.String("ca", os.Getenv("AWS_CA_BUNDLE"), "PEM file of the CA an https endpoint's certificate is checked against (default: the system's)")
	)
	flag.Parse()
	size, err := parseSize(*sizeStr)
	if err != nil || *endpoint == "" || *access == "" || *conc < 1 || *objects < 1 {
		fmt.Fprintf(os.Stderr, "s3load: need -endpoint, -access, -secret, a size, -c >= 1, -objects >= 1 (%v)\n", err)
		os.Exit(2)
	}
	transport := &http.Transport{MaxIdleConns: 4 * *conc, MaxIdleConnsPerHost: 2 * *conc, IdleConnTimeout: time.Minute,
		DisableCompression: true}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fail("-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail("-ca %s: no PEM certificate in it", *caFile)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	client := s3.New(s3.Options{
		Region:           *region,
		BaseEndpoint:     aws.String(*endpoint),
		UsePathStyle:     true,
		Credentials:      credentials.NewStaticCredentialsProvider(*access, *secret, ""),
		HTTPClient:       &http.Client{Transport: transport},
		RetryMaxAttempts: 1,
	})
	prefix := fmt.Sprintf("s3load-%d/", size)
	key := func(i int) string { return prefix + strconv.Itoa(i) }
	body := make([]byte, size)
	rand.Read(body)
	ctx := context.Background()

	put := func(k string) error {
		_, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: bucket, Key: aws.String(k), Body: bytes.NewReader(body)})
		return err
	}
	// Each worker reads bodies into a buffer of its own, up to 256 KiB at
	// a time: io.Copy into io.Discard reads 8 KiB per system call, 128 of
	// them per MiB, and on a small machine the client's CPU is part of
	// what the servers are compared by.
	bufs := make([][]byte, *conc)
	for w := range bufs {
		bufs[w] = make([]byte, min(size, 256<<10)+1)
	}
	get := func(worker int, k string) error {
		out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: bucket, Key: aws.String(k)})
		if err != nil {
			return err
		}
		n, err := drain(out.Body, bufs[worker])
		out.Body.Close()
		if err == nil && n != size {
			err = fmt.Errorf("GET %s: %d bytes, want %d", k, n, size)
		}
		return err
	}

	var op func(worker, i int) error
	switch *mode {
	case "prep":
		if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: bucket}); err != nil {
			var ae smithy.APIError
			if !errors.As(err, &ae) || (ae.ErrorCode() != "BucketAlreadyOwnedByYou" && ae.ErrorCode() != "BucketAlreadyExists") {
				fail("create bucket %s: %v", *bucket, err)
			}
		}
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, *objects)
		next := make(chan int)
		for range *conc {
			wg.Go(func() {
				for i := range next {
					if err := put(key(i)); err != nil {
						errs <- err
					}
				}
			})
		}
		for i := range *objects {
			next <- i
		}
		close(next)
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			fail("prep: %v", err)
		}
		r := Result{Label: *label, Mode: "prep", Size: size, Concurrency: *conc, Ops: *objects, Seconds: time.Since(start).Seconds()}
		r.OpsPerSec = float64(r.Ops) / r.Seconds
		r.MBPerSec = r.OpsPerSec * float64(size) / 1e6
		emit(r)
		return
	case "get":
		op = func(worker, i int) error { return get(worker, key(mrand.IntN(*objects))) }
	case "put":
		ring := max(1, *objects / *conc)
		op = func(worker, i int) error { return put(fmt.Sprintf("%sput-%d-%d", prefix, worker, i%ring)) }
	default:
		fail("unknown -mode %q (prep, get, put)", *mode)
	}

	begin := time.Now().Add(*warmup)
	end := begin.Add(*duration)
	type stats struct {
		lat    []time.Duration
		errors int
		first  error
	}
	all := make([]stats, *conc)
	var wg sync.WaitGroup
	for w := range *conc {
		wg.Go(func() {
			s := &all[w]
			for i := 0; time.Now().Before(end); i++ {
				t0 := time.Now()
				err := op(w, i)
				t1 := time.Now()
				if err != nil {
					s.errors++
					if s.first == nil {
						s.first = err
					}
					continue
				}
				if !t1.Before(begin) && !t1.After(end) {
					s.lat = append(s.lat, t1.Sub(t0))
				}
			}
		})
	}
	wg.Wait()
	r := Result{Label: *label, Mode: *mode, Size: size, Concurrency: *conc, Seconds: duration.Seconds()}
	var lat []time.Duration
	for _, s := range all {
		lat = append(lat, s.lat...)
		r.Errors += s.errors
		if s.first != nil && r.FirstError == "" {
			r.FirstError = s.first.Error()
		}
	}
	slices.Sort(lat)
	r.Ops = len(lat)
	r.OpsPerSec = float64(r.Ops) / r.Seconds
	r.MBPerSec = r.OpsPerSec * float64(size) / 1e6
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil && r.Ops > 0 {
		// Scaled to the measured time, as bench/s3.sh scales the server's.
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		r.CPUus = float64(cpu.Microseconds()) * r.Seconds / (r.Seconds + warmup.Seconds()) / float64(r.Ops)
	}
	if len(lat) > 0 {
		ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
		r.P50ms, r.P99ms = ms(0.50), ms(0.99)
	}
	emit(r)
	if r.Errors > 0 {
		os.Exit(1)
	}
}

func emit(r Result) {
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "s3load: "+format+"\n", args...)
	os.Exit(1)
}

// parseSize reads "4096", "4KiB", "1MiB" (also "4k", "1m": binary units).
func parseSize(s string) (int64, error) {
	mult := int64(1)
	l := strings.ToLower(s)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}} {
		if strings.HasSuffix(l, u.suffix) {
			l, mult = strings.TrimSuffix(l, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(l, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// drain reads r to its end into buf, returning the byte count.
func drain(r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		m, err := r.Read(buf)
		n += int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
