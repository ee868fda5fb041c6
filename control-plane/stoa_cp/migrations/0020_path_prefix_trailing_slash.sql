-- Path prefixes are stored as the site matches them, without a trailing slash (`/a/` is `/a`). A row
-- stored before with one takes that form, unless another API's prefix already is, or becomes, the
-- same: that conflict was there before (the Link refuses such an inventory, naming both routes) and
-- is the operator's to resolve; updating both rows would break the unique constraint.
UPDATE apis AS a
SET path_prefix = rtrim(a.path_prefix, '/')
WHERE a.path_prefix LIKE '_%/'
  AND NOT EXISTS (
      SELECT 1 FROM apis AS b
      WHERE b.api_id <> a.api_id AND rtrim(b.path_prefix, '/') = rtrim(a.path_prefix, '/')
  );
