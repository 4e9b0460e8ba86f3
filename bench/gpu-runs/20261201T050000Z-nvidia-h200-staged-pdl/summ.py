import re,collections,sys
d=collections.defaultdict(list); cur=None
for line in open(sys.argv[1]):
    m=re.match(r'=== round (\d+) variant (.*) cfg (.*)',line)
    if m: cur=(m.group(3).strip(),m.group(2)); continue
    for k in ['step','qkv','attn','o_proj','gate_up','down','chain']:
        m=re.match(k+r'\s+(?:median\s+)?([\d.]+)',line)
        if m: d[cur].append('%s %s'%(k,m.group(1)))
for k in sorted(d): print(k[0], '|', k[1], '|', ' '.join(d[k]))
