package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Backend keeps objects in an S3-compatible bucket under a prefix. A
// PUT is atomic in S3 (an object appears whole when its upload completes),
// so nothing half-written is ever visible.
type S3Backend struct {
	c        *minio.Client
	bucket   string
	prefix   string // "" or ending in "/"
	endpoint string
}

// openS3 opens s3://bucket/prefix?endpoint=host:port&region=r&insecure=true
// with credentials from env, and checks the bucket exists.
func openS3(ctx context.Context, u *url.URL, env func(string) string) (*S3Backend, error) {
	if u.User != nil {
		return nil, fmt.Errorf("snapshot store: put S3 credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, not in the URL")
	}
	bucket := u.Host
	if bucket == "" {
		return nil, fmt.Errorf("snapshot store %s: no bucket", redact(u.String()))
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := checkKey(prefix); err != nil {
			return nil, fmt.Errorf("snapshot store: bad prefix %.100q (lower-case letters, digits, . _ - and /)", prefix)
		}
		prefix += "/"
	}
	q := u.Query()
	endpoint := q.Get("endpoint")
	secure := true
	switch {
	case strings.HasPrefix(endpoint, "http://"):
		endpoint, secure = strings.TrimPrefix(endpoint, "http://"), false
	case strings.HasPrefix(endpoint, "https://"):
		endpoint = strings.TrimPrefix(endpoint, "https://")
	case endpoint == "":
		endpoint = "s3.amazonaws.com"
	}
	if v := q.Get("insecure"); v == "true" || v == "1" {
		secure = false
	}
	opts := &minio.Options{
		Creds:      credentials.NewStaticV4(env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN")),
		Secure:     secure,
		Region:     q.Get("region"),
		Transport:  &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: time.Minute},
		MaxRetries: 3,
	}
	if q.Get("path_style") == "true" {
		opts.BucketLookup = minio.BucketLookupPath
	}
	c, err := minio.New(endpoint, opts)
	if err != nil {
		return nil, fmt.Errorf("snapshot store %s: %w", redact(u.String()), err)
	}
	b := &S3Backend{c: c, bucket: bucket, prefix: prefix, endpoint: endpoint}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ok, err := c.BucketExists(cctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("snapshot store %s: %w", b, err)
	}
	if !ok {
		return nil, fmt.Errorf("snapshot store %s: bucket %q does not exist", b, bucket)
	}
	return b, nil
}

func (b *S3Backend) String() string {
	return "s3://" + b.bucket + "/" + strings.TrimSuffix(b.prefix, "/") + "@" + b.endpoint
}

func notExist(err error) error {
	if r := minio.ToErrorResponse(err); r.Code == minio.NoSuchKey || r.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%v: %w", err, fs.ErrNotExist)
	}
	return err
}

// Put implements Backend.
func (b *S3Backend) Put(ctx context.Context, key string, data []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	_, err := b.c.PutObject(ctx, b.bucket, b.prefix+key, bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: len(data) <= 64<<20})
	if err != nil {
		return fmt.Errorf("snapshot store: put %s: %w", key, err)
	}
	return nil
}

// Get implements Backend.
func (b *S3Backend) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	obj, err := b.c.GetObject(ctx, b.bucket, b.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("snapshot store: get %s: %w", key, notExist(err))
	}
	defer obj.Close()
	data, err := io.ReadAll(io.LimitReader(obj, max+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot store: get %s: %w", key, notExist(err))
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%w: object %s larger than %d bytes", ErrCorrupt, key, max)
	}
	return data, nil
}

// Stat implements Backend.
func (b *S3Backend) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if err := checkKey(key); err != nil {
		return ObjectInfo{}, err
	}
	info, err := b.c.StatObject(ctx, b.bucket, b.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("snapshot store: stat %s: %w", key, notExist(err))
	}
	return ObjectInfo{Key: key, Size: info.Size, ModTime: info.LastModified}, nil
}

// List implements Backend.
func (b *S3Backend) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the lister when fn fails
	for o := range b.c.ListObjects(ctx, b.bucket, minio.ListObjectsOptions{Prefix: b.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return fmt.Errorf("snapshot store: list: %w", o.Err)
		}
		key := strings.TrimPrefix(o.Key, b.prefix)
		if checkKey(key) != nil {
			continue
		}
		if err := fn(ObjectInfo{Key: key, Size: o.Size, ModTime: o.LastModified}); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements Backend.
func (b *S3Backend) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := b.c.RemoveObject(ctx, b.bucket, b.prefix+key, minio.RemoveObjectOptions{}); err != nil {
		if errors.Is(notExist(err), fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("snapshot store: delete %s: %w", key, err)
	}
	return nil
}
